// Bad model input never ends as a black image, an allocator crash or a silently wrong model
// (issue 18, classes 1, 3, 5): NaN/Inf in weights, config values out of range or non-finite,
// sizes that would allocate without bound, non-finite guidance and latents, a stage whose
// output went non-finite, and model_index.json naming pipelines or classes diffuse does not
// run. Each error names the file, key or tensor and what was expected.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "diffuse/errors.h"
#include "diffuse/pipeline.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/hidream_transformer.h"
#include "models/llama.h"
#include "models/t5_encoder.h"
#include "models/unet2d_condition.h"
#include "pipeline/finite_check.h"
#include "pipeline/memory_estimate.h"
#include "schedulers/scheduler.h"
#include "test_util.h"
#include "verify/golden.h"

namespace fs = std::filesystem;

namespace diffuse {
namespace test_bad_model_input {

using nlohmann::json;
using test::expect_throw;

const fs::path kDemo = fs::path(DIFFUSE_SOURCE_DIR) / "models" / "demo";

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

void write_json(const fs::path& p, const json& j) {
  std::ofstream(p) << j.dump(2);
}

// A copy of the demo model to spoil.
fs::path demo_copy(const test::TempDir& dir) {
  const auto out = dir.path() / "model";
  fs::copy(kDemo, out, fs::copy_options::recursive);
  return out;
}

void set_config_key(const fs::path& config, const std::string& key, const json& value) {
  auto j = read_json(config);
  j[key] = value;
  write_json(config, j);
}

std::string load_error(const fs::path& model) {
  LoadOptions lo;
  lo.device = "cpu";
  return expect_throw<Error>([&] { Text2Image::load(model.string(), lo); });
}

TEST(BadNumbers, NanInOneWeightIsRefusedAtLoadNamingTheTensorAndFile) {
  test::TempDir dir;
  const auto model = demo_copy(dir);
  const auto file = model / "unet" / "diffusion_pytorch_model.safetensors";
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  {
    auto st = io::SafetensorsFile::open(file.string());
    for (const auto& name : st->names()) {
      auto t = st->get(name).clone();
      if (name == "conv_in.weight") t.view(-1)[3] = std::numeric_limits<float>::quiet_NaN();
      tensors.emplace_back(name, t);
    }
  }
  io::save_safetensors(file.string(), tensors);
  const auto msg = load_error(model);
  EXPECT_NE(msg.find("conv_in.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 non-finite value"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unet"), std::string::npos) << msg;
}

// Quantized as they are read (--weights), layers meet the quantizer's own check: the same
// refusal naming the tensor, whether the weight is kept in ggml blocks or int8 rows.
TEST(BadNumbers, NanInAWeightQuantizedAsReadIsRefusedNamingTheTensor) {
  test::TempDir dir;
  const auto model = demo_copy(dir);
  const auto file = model / "unet" / "diffusion_pytorch_model.safetensors";
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::string poisoned;
  {
    auto st = io::SafetensorsFile::open(file.string());
    for (const auto& name : st->names()) {
      auto t = st->get(name).clone();
      if (poisoned.empty() && name.find("attn1.to_q.weight") != std::string::npos) {
        t.view(-1)[5] = std::numeric_limits<float>::infinity();
        poisoned = name;
      }
      tensors.emplace_back(name, t);
    }
  }
  ASSERT_FALSE(poisoned.empty());
  io::save_safetensors(file.string(), tensors);
  for (const char* weights : {"q8_0", "int8"}) {
    LoadOptions lo;
    lo.device = "cpu";
    lo.weights = weights;
    const auto msg = expect_throw<FormatError>([&] {
      auto t2i = Text2Image::load(model.string(), lo);
      GenerationConfig g;
      g.prompts = {"a red circle"};
      g.width = g.height = 64;
      g.steps = 1;
      t2i.generate(g);
    });
    EXPECT_NE(msg.find(poisoned), std::string::npos) << weights << ": " << msg;
    EXPECT_NE(msg.find("non-finite"), std::string::npos) << weights << ": " << msg;
  }
}

TEST(BadNumbers, ModelConfigValuesOutOfRangeNameFileAndKey) {
  struct Case {
    const char* component;
    const char* file;
    const char* key;
    json value;
  };
  const std::vector<Case> cases = {
      {"vae", "config.json", "scaling_factor", 0},
      {"vae", "config.json", "scaling_factor", -0.18},
      {"vae", "config.json", "scaling_factor", "nan"},
      {"vae", "config.json", "layers_per_block", 1000000000},
      {"vae", "config.json", "sample_size", 100000},
      {"unet", "config.json", "layers_per_block", 1000000000},
      {"unet", "config.json", "sample_size", 100000},
      {"unet", "config.json", "norm_eps", "nan"},
      {"text_encoder", "config.json", "num_hidden_layers", 1000000000},
      {"text_encoder", "config.json", "max_position_embeddings", 1000000000},
      {"text_encoder", "config.json", "layer_norm_eps", -1},
      {"scheduler", "scheduler_config.json", "num_train_timesteps", 1000000000},
      {"scheduler", "scheduler_config.json", "beta_start", "nan"},
      {"scheduler", "scheduler_config.json", "beta_end", 1.5},
      {"scheduler", "scheduler_config.json", "beta_start", 0.5},  // above beta_end: reversed
      {"scheduler", "scheduler_config.json", "steps_offset", 100000},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.component) + "." + c.key + " = " + c.value.dump());
    test::TempDir dir;
    const auto model = demo_copy(dir);
    set_config_key(model / c.component / c.file, c.key, c.value);
    const auto msg = load_error(model);
    EXPECT_NE(msg.find(c.key), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.file), std::string::npos) << msg;
  }
}

// The text encoders and transformer of HiDream (and any config reader): the same helper.
TEST(BadNumbers, EncoderAndTransformerConfigsAreBounded) {
  auto expect_key = [](const std::string& key, const std::function<void()>& read) {
    SCOPED_TRACE(key);
    const auto msg = expect_throw<ConfigError>(read);
    EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("c.json"), std::string::npos) << msg;
  };
  auto cfg = [](json j) { return io::JsonConfig(std::move(j), "c.json"); };
  expect_key("num_hidden_layers", [&] {
    models::LlamaConfig::from_json(cfg({{"num_hidden_layers", 1000000000}}));
  });
  expect_key("rope_theta", [&] { models::LlamaConfig::from_json(cfg({{"rope_theta", "inf"}})); });
  expect_key("vocab_size", [&] {
    models::T5Config::from_json(cfg({{"vocab_size", int64_t{1} << 40}}));
  });
  expect_key("layer_norm_epsilon", [&] {
    models::T5Config::from_json(cfg({{"layer_norm_epsilon", 0}}));
  });
  expect_key("eos_token_id", [&] {
    models::ClipTextConfig::from_json(cfg({{"vocab_size", 100}, {"eos_token_id", 100}}));
  });
  const json hidream = {{"patch_size", 2},
                        {"caption_channels", {8, 8}},
                        {"attention_head_dim", 8},
                        {"axes_dims_rope", {2, 2, 4}}};
  auto with = [&](const char* key, json v) {
    json j = hidream;
    j[key] = std::move(v);
    return cfg(j);
  };
  expect_key("num_layers",
             [&] { models::HiDreamTransformerConfig::from_json(with("num_layers", 1000000000)); });
  expect_key("max_resolution", [&] {
    models::HiDreamTransformerConfig::from_json(with("max_resolution", {100000, 100000}));
  });
  expect_key("patch_size",
             [&] { models::HiDreamTransformerConfig::from_json(with("patch_size", 0)); });
}

TEST(BadNumbers, GuidanceAndLatentsMustBeFinite) {
  LoadOptions lo;
  lo.device = "cpu";
  auto t2i = Text2Image::load(kDemo.string(), lo);
  GenerationConfig g;
  g.prompts = {"a red circle"};
  g.steps = 2;
  g.seed = 1;
  g.guidance_scale = std::numeric_limits<double>::infinity();
  EXPECT_NE(expect_throw<InvalidArgument>([&] { t2i.generate(g); }).find("guidance"),
            std::string::npos);
  // Finite but absurd: the values overflow during denoising; the run stops there, naming the
  // stage, instead of writing a black image.
  g.guidance_scale = 1e308;
  const auto msg = expect_throw<NumericalError>([&] { t2i.generate(g); });
  EXPECT_NE(msg.find("denoising"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;

  g.guidance_scale = 7.5;
  const int64_t side = t2i.info().default_width / 8;
  g.latents = torch::zeros({1, 4, side, side});
  g.latents[0][0][0][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(expect_throw<InvalidArgument>([&] { t2i.generate(g); }).find("given latents"),
            std::string::npos);
  g.latents = torch::zeros({1, 4, side, side}, torch::kInt32);
  EXPECT_NE(expect_throw<InvalidArgument>([&] { t2i.generate(g); }).find("floating-point"),
            std::string::npos);
}

TEST(BadNumbers, AGenerationThatCannotFitIsRefusedBeforeAllocating) {
  LoadOptions lo;
  lo.device = "cpu";
  auto t2i = Text2Image::load(kDemo.string(), lo);
  GenerationConfig g;
  g.prompts = {"a red circle"};
  g.steps = 1;
  g.width = g.height = 8192;
  // About 50 TB of activations even for the demo UNet: refused on any machine (256 images
  // fitted in the 128 GiB of a GPU host, which then ran them).
  g.images_per_prompt = 65536;
  const auto msg = expect_throw<InvalidArgument>([&] { t2i.generate(g); });
  EXPECT_NE(msg.find("needs about"), std::string::npos) << msg;
  EXPECT_NE(msg.find("65536 images at 8192x8192"), std::string::npos) << msg;
  EXPECT_NE(msg.find("available"), std::string::npos) << msg;
  // Saturating arithmetic: sizes whose product overflows int64 are "too much", not wrapped.
  EXPECT_EQ(pipeline::activation_bytes(int64_t{1} << 40, 1 << 20, 1 << 20, 1 << 20, 4, 3),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(pipeline::activation_bytes(2, 128, 64, 64, 4, 3), int64_t{2} * 128 * 64 * 64 * 4 * 3);
}

TEST(BadModelFolder, UnsupportedPipelineOrComponentClassIsRefused) {
  for (auto [key, value] :
       {std::pair<std::string, json>{"_class_name", "StableDiffusionUpscalePipeline"},
        {"unet", json::array({"diffusers", "UNet2DModel"})},
        {"vae", json::array({"diffusers", "AutoencoderTiny"})}}) {
    SCOPED_TRACE(key);
    test::TempDir dir;
    const auto model = demo_copy(dir);
    set_config_key(model / "model_index.json", key, value);
    const auto msg = load_error(model);
    EXPECT_NE(msg.find("model_index.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not supported"), std::string::npos) << msg;
  }
}

TEST(BadModelFolder, TokenizerIdsBeyondTheTextEncodersVocabularyAreRefused) {
  test::TempDir dir;
  const auto model = demo_copy(dir);
  auto vocab = read_json(model / "tokenizer" / "vocab.json");
  vocab["zzzz</w>"] = 100000;
  write_json(model / "tokenizer" / "vocab.json", vocab);
  const auto msg = load_error(model);
  EXPECT_NE(msg.find("'zzzz</w>' has id 100000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size"), std::string::npos) << msg;
}

TEST(BadModelFolder, SingleFileWhoseInferredConfigFailsSuggestsAConfigFolder) {
  const auto set = verify::GoldenSet::load(test::golden_dir());
  const std::string file = set.single_file_checkpoint();
  if (file.empty()) GTEST_SKIP() << "golden set has no single-file checkpoint";
  test::TempDir dir;
  // Two rows of token embeddings: the inferred vocab_size (2) cannot hold CLIP's eos id (2).
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  auto f = io::SafetensorsFile::open(file);
  for (const auto& name : f->names()) {
    auto t = f->get(name);
    const std::string suffix = "token_embedding.weight";
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      t = t.narrow(0, 0, 2);
    tensors.emplace_back(name, t);
  }
  const auto ckpt = dir.path() / "model.safetensors";
  io::save_safetensors(ckpt.string(), tensors);
  fs::copy(fs::path(set.model_dir()) / "tokenizer", dir.path() / "tokenizer",
           fs::copy_options::recursive);
  const auto msg = load_error(ckpt);
  EXPECT_NE(msg.find("eos_token_id"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--config DIR"), std::string::npos) << msg;
}

TEST(BadNumbers, StageCheckSuggestsAnotherDtypeForFp16) {
  auto t = torch::ones({2, 2}, torch::kFloat16);
  pipeline::check_stage_finite(t, "VAE decoder", torch::kCPU, torch::kFloat16);  // finite: fine
  t[0][0] = std::numeric_limits<float>::infinity();
  const auto msg = expect_throw<NumericalError>(
      [&] { pipeline::check_stage_finite(t, "VAE decoder", torch::kCPU, torch::kFloat16); });
  EXPECT_NE(msg.find("VAE decoder"), std::string::npos) << msg;
  EXPECT_NE(msg.find("infinite"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--vae-dtype fp32"), std::string::npos) << msg;
}

}  // namespace test_bad_model_input
}  // namespace diffuse
