// Single-file (LDM layout) checkpoints: the golden set stores the same weights in both layouts,
// so the mapped state dicts must equal the diffusers folder's bit for bit. Everything about
// the model is read from the files; variants (SD1 text layout, a full OpenCLIP tower, bad
// files) are built from the golden tensors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <set>

#include "diffuse/errors.h"
#include "io/gguf.h"
#include "io/ldm_checkpoint.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "io/string_affixes.h"
#include "test_util.h"

namespace diffuse {
namespace test_ldm_checkpoint {

using json = nlohmann::json;
using TensorList = std::vector<std::pair<std::string, torch::Tensor>>;
using TensorMap = std::map<std::string, torch::Tensor>;

using io::ends_with;
using io::starts_with;

class LdmCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    set_ = verify::GoldenSet::load(test::golden_dir());
    file_ = set_.single_file_checkpoint();
    if (file_.empty()) GTEST_SKIP() << "golden set has no single_file_checkpoint in cases.json";
  }

  // The golden single-file tensors, in file order, for building variants.
  TensorList ldm_tensors() const {
    auto f = io::SafetensorsFile::open(file_);
    TensorList out;
    for (const auto& name : f->names()) out.emplace_back(name, f->get(name));
    return out;
  }
  bool has_open_clip() const {
    for (const auto& [name, t] : ldm_tensors())
      if (starts_with(name, "cond_stage_model.model.")) return true;
    return false;
  }
  io::ModelFolder folder() const { return io::ModelFolder::open(set_.model_dir()); }
  json golden_config(const std::string& component) const {
    return folder().component_config(component).json();
  }

  verify::GoldenSet set_;
  std::string file_;
  test::TempDir tmp_;
};

// Same key set (position_ids is a buffer some files carry) and bit-identical tensors.
void expect_same_weights(const std::string& what, TensorMap got, TensorMap want) {
  got.erase("text_model.embeddings.position_ids");
  want.erase("text_model.embeddings.position_ids");
  std::vector<std::string> missing, extra;
  for (const auto& [k, v] : want)
    if (!got.count(k)) missing.push_back(k);
  for (const auto& [k, v] : got)
    if (!want.count(k)) extra.push_back(k);
  EXPECT_TRUE(missing.empty()) << what << ": " << missing.size() << " keys missing, e.g. "
                               << missing.front();
  EXPECT_TRUE(extra.empty()) << what << ": " << extra.size() << " unexpected keys, e.g. "
                             << extra.front();
  int checked = 0;
  for (const auto& [k, w] : want) {
    auto it = got.find(k);
    if (it == got.end()) continue;
    ASSERT_EQ(it->second.sizes(), w.sizes()) << what << " " << k;
    ASSERT_EQ(it->second.scalar_type(), w.scalar_type()) << what << " " << k;
    EXPECT_TRUE(torch::equal(it->second, w)) << what << " " << k << " differs";
    ++checked;
  }
  EXPECT_GT(checked, 0) << what;
}

// Compares the keys the weights determine; a per-level value may be one number or a list.
void expect_same_keys(const std::string& what, const json& got, const json& want,
                      const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (!want.contains(key)) continue;
    ASSERT_TRUE(got.contains(key)) << what << ": inferred config lacks '" << key << "'";
    json g = got[key], w = want[key];
    if (g.is_array() && !w.is_array()) w = json(std::vector<json>(g.size(), w));
    if (w.is_array() && !g.is_array()) g = json(std::vector<json>(w.size(), g));
    EXPECT_EQ(g, w) << what << "." << key;
  }
}

template <typename Fn>
void expect_error(const std::string& what, Fn fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << what << ": expected an error";
  } catch (const FormatError& e) {
    std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << what << ": " << msg;
  }
}

TEST_F(LdmCheckpoint, GoldenWeightsEqualTheDiffusersFolder) {
  auto c = io::load_single_file_checkpoint(file_);
  auto f = folder();
  expect_same_weights("unet", c.unet, f.component_weights("unet"));
  expect_same_weights("vae", c.vae, f.component_weights("vae"));
  expect_same_weights("text_encoder", c.text_encoder, f.component_weights("text_encoder"));
  EXPECT_EQ(c.family, has_open_clip() ? "sd2" : "sd1");
  EXPECT_TRUE(io::is_single_file_checkpoint(file_));
}

// The same checkpoint as a GGUF file, as stable-diffusion.cpp's converter writes one: matrices
// with whole 32-element rows in q8_0, everything else in f32. It loads through the same path;
// the f32 tensors are bit-identical and the q8_0 ones within a step of q8_0 (a block's largest
// magnitude / 127, fp16 scale rounding included).
TEST_F(LdmCheckpoint, GgufSingleFileLoadsLikeTheSafetensorsOne) {
  std::vector<io::GgufTensorToWrite> tensors;
  std::set<std::string> quantized;
  for (const auto& [name, t] : ldm_tensors()) {
    const bool q8 = t.dim() == 2 && t.size(1) % 32 == 0;
    if (q8) quantized.insert(name);
    tensors.push_back({name, t, q8 ? quant::GgmlType::Q8_0 : quant::GgmlType::F32});
  }
  ASSERT_FALSE(quantized.empty());
  const std::string gguf = tmp_.file("model.gguf");
  io::write_gguf(gguf, {{"general.architecture", "sd"}}, tensors);
  EXPECT_TRUE(io::is_gguf_file(gguf));
  EXPECT_TRUE(io::is_single_file_checkpoint(gguf));
  const auto from_gguf = io::load_single_file_checkpoint(gguf);
  const auto from_safetensors = io::load_single_file_checkpoint(file_);
  EXPECT_EQ(from_gguf.family, from_safetensors.family);
  EXPECT_EQ(from_gguf.unet_config, from_safetensors.unet_config);
  int compared = 0, compared_q8 = 0;
  auto compare = [&](const TensorMap& got, const TensorMap& want, const std::string& prefix) {
    ASSERT_EQ(got.size(), want.size()) << prefix;
    for (const auto& [k, w] : want) {
      const auto& g = got.at(k);
      ASSERT_EQ(g.sizes(), w.sizes()) << k;
      const auto want32 = w.to(torch::kFloat32);
      const auto err = (g.to(torch::kFloat32) - want32).abs();
      // A q8_0 tensor's rows are blocks of 32: the error bound per element is its block's step.
      if (w.dim() == 2 && w.size(1) % 32 == 0 && err.max().item<float>() > 0) {
        const auto step = want32.reshape({-1, 32}).abs().amax(1, true) / 127;
        EXPECT_TRUE((err.reshape({-1, 32}) <= step * 1.01).all().item<bool>()) << k;
        ++compared_q8;
      } else {
        EXPECT_TRUE(torch::equal(g.to(torch::kFloat32), want32)) << k;
      }
      ++compared;
    }
  };
  compare(from_gguf.unet, from_safetensors.unet, "unet");
  compare(from_gguf.vae, from_safetensors.vae, "vae");
  compare(from_gguf.text_encoder, from_safetensors.text_encoder, "text_encoder");
  EXPECT_GT(compared_q8, 0);
  EXPECT_GT(compared, compared_q8);
}

TEST_F(LdmCheckpoint, InferredConfigsAgreeOnEveryShapeDeterminedKey) {
  auto c = io::load_single_file_checkpoint(file_);
  expect_same_keys(
      "unet", c.unet_config, golden_config("unet"),
      {"block_out_channels", "layers_per_block", "in_channels", "out_channels",
       "cross_attention_dim", "use_linear_projection", "down_block_types", "up_block_types"});
  expect_same_keys("vae", c.vae_config, golden_config("vae"),
                   {"block_out_channels", "layers_per_block", "latent_channels", "in_channels",
                    "out_channels", "down_block_types", "up_block_types"});
  expect_same_keys("text_encoder", c.text_encoder_config, golden_config("text_encoder"),
                   {"hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size",
                    "max_position_embeddings"});
  EXPECT_EQ(c.text_encoder_config["hidden_act"], has_open_clip() ? "gelu" : "quick_gelu");
  EXPECT_EQ(c.scheduler_config["_class_name"], "PNDMScheduler");
  EXPECT_EQ(c.scheduler_config["prediction_type"], "epsilon");  // the file says nothing else
  // Heads cannot be read from weights: they are reported as assumed.
  EXPECT_NE(std::find(c.assumed.begin(), c.assumed.end(), "unet.attention_head_dim"),
            c.assumed.end());
}

TEST_F(LdmCheckpoint, ConfigFolderIsUsedAfterCheckingItAgainstTheWeights) {
  io::SingleFileOptions opt;
  opt.config_dir = set_.model_dir();
  auto c = io::load_single_file_checkpoint(file_, opt);
  EXPECT_EQ(c.unet_config, golden_config("unet"));  // includes attention_head_dim
  EXPECT_EQ(c.vae_config, golden_config("vae"));
  EXPECT_EQ(c.text_encoder_config, golden_config("text_encoder"));
  EXPECT_EQ(c.scheduler_config,
            folder().component_config("scheduler", "scheduler_config.json").json());
  EXPECT_TRUE(c.assumed.empty());
  expect_same_weights("unet", c.unet, folder().component_weights("unet"));

  // A folder whose UNet disagrees with the weights is refused, naming the key.
  namespace fs = std::filesystem;
  fs::path dir = tmp_.path() / "configs";
  for (const std::string comp : {"unet", "vae", "text_encoder", "scheduler"}) {
    fs::create_directories(dir / comp);
    std::string name = comp == "scheduler" ? "scheduler_config.json" : "config.json";
    fs::copy_file(fs::path(set_.model_dir()) / comp / name, dir / comp / name);
  }
  fs::copy_file(fs::path(set_.model_dir()) / "model_index.json", dir / "model_index.json");
  json unet = golden_config("unet");
  unet["block_out_channels"][0] = unet["block_out_channels"][0].get<int>() * 2;
  std::ofstream((dir / "unet" / "config.json").string(), std::ios::trunc) << unet.dump(2);
  opt.config_dir = dir.string();
  try {
    io::load_single_file_checkpoint(file_, opt);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("block_out_channels"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unet"), std::string::npos) << msg;
  }
}

TEST_F(LdmCheckpoint, PredictionTypeComesFromOptionsOrFileMetadata) {
  io::SingleFileOptions opt;
  opt.v_prediction = true;
  auto c = io::load_single_file_checkpoint(file_, opt);
  EXPECT_EQ(c.scheduler_config["prediction_type"], "v_prediction");
  EXPECT_EQ(c.unet_config["upcast_attention"], c.family == "sd2");

  std::string p = tmp_.file("v.safetensors");
  io::save_safetensors(p, ldm_tensors(), {{"modelspec.prediction_type", "v"}});
  EXPECT_EQ(io::load_single_file_checkpoint(p).scheduler_config["prediction_type"], "v_prediction");
  opt.v_prediction = false;  // an explicit option wins over metadata
  EXPECT_EQ(io::load_single_file_checkpoint(p, opt).scheduler_config["prediction_type"], "epsilon");
}

TEST_F(LdmCheckpoint, TrainingStateIsIgnored) {
  auto tensors = ldm_tensors();
  for (const char* name : {"betas", "alphas_cumprod", "posterior_mean_coef1", "model_ema.decay",
                           "model_ema.num_updates", "first_stage_model.loss.logvar"})
    tensors.emplace_back(name, torch::ones({3}));
  std::string p = tmp_.file("with_state.safetensors");
  io::save_safetensors(p, tensors);
  auto c = io::load_single_file_checkpoint(p);
  expect_same_weights("unet", c.unet, folder().component_weights("unet"));
}

TEST_F(LdmCheckpoint, FullOpenClipTowerDropsTheLayerSd2DoesNotRun) {
  if (!has_open_clip()) GTEST_SKIP() << "golden text encoder is not in the OpenCLIP layout";
  const std::string prefix = "cond_stage_model.model.transformer.resblocks.";
  auto tensors = ldm_tensors();
  int layers = golden_config("text_encoder")["num_hidden_layers"].get<int>();
  int64_t hidden = golden_config("text_encoder")["hidden_size"].get<int64_t>();
  std::string last = prefix + std::to_string(layers - 1) + ".";
  TensorList extra;
  for (const auto& [name, t] : tensors)
    if (starts_with(name, last))
      extra.emplace_back(prefix + std::to_string(layers) + "." + name.substr(last.size()), t + 1);
  ASSERT_FALSE(extra.empty());
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  auto want = folder().component_weights("text_encoder");

  // Without text_projection the extra layer counts as used...
  std::string p = tmp_.file("tower.safetensors");
  io::save_safetensors(p, tensors);
  auto c = io::load_single_file_checkpoint(p);
  EXPECT_EQ(c.text_encoder_config["num_hidden_layers"], layers + 1);
  // ...unless a config folder says otherwise.
  io::SingleFileOptions opt;
  opt.config_dir = set_.model_dir();
  expect_same_weights("text_encoder", io::load_single_file_checkpoint(p, opt).text_encoder, want);

  // The full tower (text_projection, logit_scale) as the original training code saved it.
  tensors.emplace_back("cond_stage_model.model.text_projection", torch::randn({hidden, hidden}));
  tensors.emplace_back("cond_stage_model.model.logit_scale", torch::tensor(4.6f));
  io::save_safetensors(p, tensors);
  c = io::load_single_file_checkpoint(p);
  EXPECT_EQ(c.text_encoder_config["num_hidden_layers"], layers);
  expect_same_weights("text_encoder", c.text_encoder, want);
}

TEST_F(LdmCheckpoint, Sd1LayoutWithTransformersClipAndConvProjections) {
  // SD1 files keep the CLIP text encoder under transformers' names and use 1x1 convs for
  // the spatial transformers' proj_in / proj_out.
  TensorList tensors;
  TensorMap unet_want = folder().component_weights("unet");
  for (const auto& [name, t] : ldm_tensors()) {
    if (starts_with(name, "cond_stage_model.")) continue;
    bool proj = starts_with(name, "model.diffusion_model.") &&
                (ends_with(name, "proj_in.weight") || ends_with(name, "proj_out.weight"));
    tensors.emplace_back(name, proj && t.dim() == 2 ? t.reshape({t.size(0), t.size(1), 1, 1}) : t);
  }
  for (auto& [name, t] : unet_want)
    if ((ends_with(name, "proj_in.weight") || ends_with(name, "proj_out.weight")) && t.dim() == 2)
      t = t.reshape({t.size(0), t.size(1), 1, 1});
  auto text = folder().component_weights("text_encoder");
  int64_t positions = text.at("text_model.embeddings.position_embedding.weight").size(0);

  for (bool rooted : {true, false}) {  // old transformers versions had no "text_model." level
    TensorList variant = tensors;
    for (const auto& [name, t] : text)
      variant.emplace_back("cond_stage_model.transformer." + (rooted ? name : name.substr(11)), t);
    variant.emplace_back(std::string("cond_stage_model.transformer.") +
                             (rooted ? "text_model." : "") + "embeddings.position_ids",
                         torch::arange(positions).unsqueeze(0));
    std::string p = tmp_.file("sd1.safetensors");
    io::save_safetensors(p, variant);
    auto c = io::load_single_file_checkpoint(p);
    EXPECT_EQ(c.family, "sd1");
    EXPECT_EQ(c.unet_config["use_linear_projection"], false);
    EXPECT_EQ(c.unet_config["attention_head_dim"], 8);
    EXPECT_EQ(c.text_encoder_config["hidden_act"], "quick_gelu");
    expect_same_weights("unet", c.unet, unet_want);
    expect_same_weights("text_encoder", c.text_encoder, text);
    expect_same_weights("vae", c.vae, folder().component_weights("vae"));
  }
}

TEST_F(LdmCheckpoint, UnknownOrInconsistentKeysAreFormatErrors) {
  auto tensors = ldm_tensors();
  tensors.emplace_back("model.diffusion_model.mystery.0.weight", torch::ones({2, 2}));
  tensors.emplace_back("first_stage_model.encoder.mystery.weight", torch::ones({2}));
  tensors.emplace_back("some_other_thing", torch::ones({1}));
  std::string p = tmp_.file("extra.safetensors");
  io::save_safetensors(p, tensors);
  expect_error("leftovers", [&] { io::load_single_file_checkpoint(p); },
               {p, "3 tensors", "model.diffusion_model.mystery.0.weight",
                "first_stage_model.encoder.mystery.weight", "some_other_thing"});

  // Without the first downsampler, input and output levels no longer mirror each other.
  TensorList no_down;
  std::string op;
  for (const auto& [name, t] : ldm_tensors())
    if (op.empty() && ends_with(name, ".0.op.weight")) op = name.substr(0, name.size() - 6);
  ASSERT_FALSE(op.empty());
  for (const auto& [name, t] : ldm_tensors())
    if (!starts_with(name, op)) no_down.emplace_back(name, t);
  p = tmp_.file("no_down.safetensors");
  io::save_safetensors(p, no_down);
  expect_error("structure", [&] { io::load_single_file_checkpoint(p); }, {p, "input_blocks"});
}

TEST_F(LdmCheckpoint, FilesThatAreNotSingleFileCheckpointsAreRefused) {
  std::string random = tmp_.file("random.safetensors");
  io::save_safetensors(random, {{"foo.weight", torch::randn({3, 3})}, {"bar", torch::ones({2})}});
  expect_error("no unet", [&] { io::load_single_file_checkpoint(random); },
               {random, "model.diffusion_model"});
  EXPECT_FALSE(io::is_single_file_checkpoint(random));

  std::string text = tmp_.file("notes.safetensors");
  std::ofstream(text) << "this is not a safetensors file at all";
  expect_error("garbage", [&] { io::load_single_file_checkpoint(text); }, {text, "safetensors"});
  EXPECT_FALSE(io::is_single_file_checkpoint(text));

  std::string ckpt = tmp_.file("model.ckpt");
  std::ofstream(ckpt, std::ios::binary) << std::string("PK\x03\x04", 4) << "archive/data.pkl";
  expect_error("pickle", [&] { io::load_single_file_checkpoint(ckpt); },
               {ckpt, "pickle", "convert it to .safetensors"});
  EXPECT_FALSE(io::is_single_file_checkpoint(ckpt));

  EXPECT_THROW(io::load_single_file_checkpoint(tmp_.file("missing.safetensors")), IoError);
  EXPECT_FALSE(io::is_single_file_checkpoint(tmp_.file("missing.safetensors")));
  EXPECT_FALSE(io::is_single_file_checkpoint(tmp_.path().string()));
}

}  // namespace test_ldm_checkpoint
}  // namespace diffuse
