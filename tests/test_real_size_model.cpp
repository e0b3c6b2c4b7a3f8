// create-demo-model's complete folders (pipeline/real_size_model.h): the real-size specs
// have the real networks' sizes; a folder written at the golden set's small configs loads and
// draws, in bf16 and with a q8_0 GGUF transformer whose values are the bf16 folder's within q8_0's
// rounding; bad requests leave nothing behind.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "cli_run.h"
#include "diffuse/errors.h"
#include "io/gguf.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "models/flux_transformer.h"
#include "models/t5_encoder.h"
#include "models/unet2d_condition.h"
#include "nn/layers.h"
#include "pipeline/hidream.h"
#include "pipeline/memory_plan_folder.h"
#include "pipeline/real_size_model.h"
#include "pipeline/stable_diffusion.h"
#include "pipeline_test_util.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_real_size_model {

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// The real-size spec of hidream-i1 with every network's config taken from the golden tiny
// folder: the same writer, at a size a test can write.
pipeline::RandomFolderSpec tiny_hidream_spec(const fs::path& model) {
  auto s = pipeline::real_size_spec("hidream-i1");
  s.denoiser = read_json(model / "transformer" / "config.json");
  s.vae = read_json(model / "vae" / "config.json");
  for (auto& t : s.text_encoders) t.config = read_json(model / t.component / "config.json");
  return s;
}

TEST(RealSizeModel, SpecsHaveTheRealNetworksSizes) {
  // Built without initialisation: counting parameters touches no memory.
  auto count = [](auto module) {
    int64_t n = 0;
    for (const auto& p : module->parameters()) n += p.numel();
    return n;
  };
  nn::SkipInitGuard skip(torch::kBFloat16);
  const auto flux = pipeline::real_size_spec("flux-dev");
  EXPECT_EQ(flux.pipeline_class, "FluxPipeline");
  // FLUX.1-dev's transformer: 11,901,408,320 parameters; T5-XXL's encoder: 4,762,310,656.
  EXPECT_EQ(count(models::FluxTransformer2DModel(models::FluxTransformerConfig::from_json(
                io::JsonConfig(flux.denoiser, "flux-dev")))),
            11901408320);
  ASSERT_EQ(flux.text_encoders.size(), 2u);
  EXPECT_EQ(count(models::T5EncoderModel(
                models::T5Config::from_json(io::JsonConfig(flux.text_encoders[1].config, "t5")))),
            4762310656);
  EXPECT_EQ(flux.text_encoders[1].max_length, 512);
  EXPECT_EQ(pipeline::real_size_spec("flux-schnell").text_encoders[1].max_length, 256);
  EXPECT_EQ(pipeline::real_size_spec("flux-kontext").pipeline_class, "FluxKontextPipeline");
  const auto e1 = pipeline::real_size_spec("hidream-e1");
  EXPECT_EQ(e1.pipeline_class, "HiDreamImageEditingPipeline");
  ASSERT_EQ(e1.text_encoders.size(), 4u);
  EXPECT_EQ(e1.text_encoders[3].kind, "llama");
  EXPECT_THROW(pipeline::real_size_spec("flux-pro"), InvalidArgument);

  // Stable Diffusion: SD2.1-base's UNet has 865,910,724 parameters, SDXL's 2,567,463,684.
  auto unet = [&](const pipeline::RandomFolderSpec& s) {
    return count(models::UNet2DConditionModel(
        models::UNet2DConditionConfig::from_json(io::JsonConfig(s.denoiser, s.arch))));
  };
  const auto sd21 = pipeline::real_size_spec("sd2.1-base");
  EXPECT_EQ(sd21.denoiser_component(), "unet");
  EXPECT_EQ(sd21.pipeline_class, "StableDiffusionPipeline");
  EXPECT_EQ(sd21.default_weights, "fp16");
  EXPECT_EQ(unet(sd21), 865910724);
  const auto sdxl = pipeline::real_size_spec("sdxl");
  EXPECT_EQ(sdxl.pipeline_class, "StableDiffusionXLPipeline");
  ASSERT_EQ(sdxl.text_encoders.size(), 2u);
  EXPECT_EQ(sdxl.text_encoders[1].config["architectures"][0], "CLIPTextModelWithProjection");
  EXPECT_EQ(unet(sdxl), 2567463684);
}

// Stable Diffusion folders come from the same streaming writer: a small UNet's folder in fp16
// (as the repositories' fp16 variants) and with a q8_0 GGUF UNet loads and draws.
TEST(RealSizeModel, StableDiffusionFolderLoadsAndDrawsInFp16AndQ8) {
  const auto spec = pipeline::real_size_spec("tiny");
  test::TempDir tmp;
  pipeline::RandomFolderOptions o;
  for (const std::string weights : {"", "q8_0"}) {
    o.weights = weights;
    const auto dir = tmp.path() / (weights.empty() ? "fp16" : weights);
    pipeline::write_random_folder(dir.string(), spec, o);
    const auto index = read_json(dir / "model_index.json");
    EXPECT_EQ(index["_class_name"], "StableDiffusionPipeline");
    EXPECT_EQ(index["unet"][1], "UNet2DConditionModel");
    EXPECT_EQ(index["requires_safety_checker"], false);
    if (weights.empty()) {
      const auto unet = io::ModelFolder::open(dir.string()).component_weights("unet");
      ASSERT_FALSE(unet.empty());
      for (const auto& [name, t] : unet) EXPECT_EQ(t.scalar_type(), torch::kFloat16) << name;
    } else {
      EXPECT_TRUE(fs::exists(dir / "unet" / "diffusion_pytorch_model.gguf"));
    }
    pipeline::StableDiffusion sd(dir.string(), test::fp32_cpu());
    // The GGUF UNet's blocks stay quantized (read through its table, not dequantized).
    EXPECT_EQ(sd.info().weights, weights.empty() ? "none" : "gguf");
    GenerationConfig g;
    g.prompts = {"a red fox in the snow"};
    g.steps = 1;
    g.width = g.height = 32;
    g.seed = 1;
    const auto r = sd.text2image(g, {});
    ASSERT_EQ(r.images.size(), 1u) << dir;
    EXPECT_EQ(r.images[0].width, 32) << dir;
    EXPECT_TRUE(torch::isfinite(r.latents).all().item<bool>()) << dir;
    EXPECT_GT(r.latents.std().item<double>(), 0.0) << dir;
    if (weights.empty()) continue;
    // With --weights the GGUF's plain convolutions (ggml blocks run along the last dimension,
    // never a kernel's 3 taps) are quantized as they are read: every one whose rows are whole
    // blocks.
    auto lo = test::fp32_cpu();
    lo.weights = "q8_0";
    pipeline::StableDiffusion sdq(dir.string(), lo);
    // Every convolution whose rows are whole blocks, the UNet's and the VAE's (the text
    // encoder stays plain).
    std::map<std::string, std::pair<int, int>> blockable_quantized;
    for (const auto& [name, net] : sdq.loaded_networks()) {
      if (name != "unet" && name != "vae") continue;
      auto& [blockable, quantized] = blockable_quantized[name];
      for (const auto& m : net->modules())
        if (const auto* conv = dynamic_cast<const nn::Conv2dImpl*>(m.get())) {
          const auto& w = conv->weight;
          blockable += (w.numel() / w.size(0)) % 32 == 0;
          quantized += conv->quantized != nullptr;
        }
    }
    ASSERT_EQ(blockable_quantized.size(), 2u);
    for (const auto& [name, counts] : blockable_quantized) {
      EXPECT_GT(counts.first, 0) << name;
      EXPECT_EQ(counts.second, counts.first) << name;
    }
    // The plan weighs them as quantized too: less than the file's bytes, which hold them plain.
    pipeline::FolderPlanOptions po;
    po.weight_type = "q8_0";
    const auto request = pipeline::plan_request(io::ModelFolder::open(dir.string()), po);
    EXPECT_LT(request.denoiser.quantized_bytes, request.denoiser.bytes);
    EXPECT_GT(request.denoiser.quantized_bytes, request.denoiser.bytes / 2);
    const auto plain = pipeline::plan_request(io::ModelFolder::open(dir.string()), {});
    EXPECT_LT(request.vae.bytes, plain.vae.bytes) << "the VAE's blocks";
    const auto rq = sdq.text2image(g, {});
    EXPECT_TRUE(torch::isfinite(rq.latents).all().item<bool>());
    EXPECT_EQ(rq.timings.plan.rfind("plan: ", 0), 0u) << rq.timings.plan;
  }
}

TEST(RealSizeModel, AWrittenFolderLoadsAndDrawsInBf16AndQ8) {
  const auto golden = test::hidream_golden_dir();
  if (!fs::exists(golden + "/cases.json")) GTEST_SKIP() << "no golden set at " << golden;
  const fs::path model = verify::GoldenSet::load(golden).model_dir();
  const auto spec = tiny_hidream_spec(model);
  test::TempDir tmp;
  pipeline::RandomFolderOptions o;
  o.shard_bytes = 64 << 10;  // several shards per network
  const auto bf16_dir = tmp.path() / "bf16";
  const auto report = pipeline::write_random_folder(bf16_dir.string(), spec, o);
  EXPECT_GT(report.bytes, 0);
  EXPECT_FALSE(fs::exists(tmp.path() / "bf16.partial"));
  EXPECT_TRUE(
      fs::exists(bf16_dir / "transformer" / "diffusion_pytorch_model.safetensors.index.json"));
  const auto index = read_json(bf16_dir / "model_index.json");
  EXPECT_EQ(index["_class_name"], "HiDreamImagePipeline");
  EXPECT_EQ(index["text_encoder_4"][1], "LlamaForCausalLM");

  o.weights = "q8_0";
  const auto q8_dir = tmp.path() / "q8";
  pipeline::write_random_folder(q8_dir.string(), spec, o);
  const auto gguf_path = q8_dir / "transformer" / "diffusion_pytorch_model.gguf";
  ASSERT_TRUE(fs::exists(gguf_path));

  // The same seed gives the same values: the GGUF's q8_0 matrices are the bf16 folder's within
  // half a quantization step (per block of 32: d = max |x| / 127), plus 127 codes times the
  // rounding of d to float16 (2^-11 d): 0.562 d.
  const auto plain = io::ModelFolder::open(bf16_dir.string()).component_weights("transformer");
  const auto gguf = io::GgufFile::open(gguf_path.string());
  int quantized = 0;
  for (const auto& name : gguf->names()) {
    ASSERT_TRUE(plain.count(name)) << name;
    const auto want = plain.at(name).to(torch::kFloat64);
    const auto got = gguf->dequantized(name).to(torch::kFloat64).reshape(want.sizes());
    if (gguf->info(name).type != quant::GgmlType::Q8_0) {
      EXPECT_TRUE(torch::equal(got, want)) << name;
      continue;
    }
    ++quantized;
    const auto blocks = want.reshape({-1, 32});
    const auto step = blocks.abs().amax(1, true) / 127.0;
    const auto err = (got.reshape({-1, 32}) - blocks).abs();
    EXPECT_TRUE((err <= (0.5 + 127.0 / 2048) * step * (1 + 1e-6) + 1e-12).all().item<bool>())
        << name;
  }
  EXPECT_GT(quantized, 0);

  // Both folders draw (the tokenizers, configs and names all load by diffusers' layout).
  for (const auto& dir : {bf16_dir, q8_dir}) {
    const auto folder = io::ModelFolder::open(dir.string());
    pipeline::HiDreamPipeline pipe(folder, torch::kCPU, torch::kFloat32);
    pipeline::HiDreamTextToImage t2i;
    t2i.prompt = "a red fox in the snow";
    t2i.sampling.steps = 1;
    t2i.width = t2i.height = static_cast<int>(2 * pipe.size_multiple());
    const auto made = pipe.text_to_image(t2i);
    EXPECT_TRUE(torch::isfinite(made.image).all().item<bool>()) << dir;
    EXPECT_GT(made.image.std().item<double>(), 0.0) << dir;
  }
}

TEST(RealSizeModel, BadRequestsWriteNothing) {
  const auto golden = test::hidream_golden_dir();
  if (!fs::exists(golden + "/cases.json")) GTEST_SKIP() << "no golden set at " << golden;
  const auto spec = tiny_hidream_spec(verify::GoldenSet::load(golden).model_dir());
  test::TempDir tmp;
  pipeline::RandomFolderOptions o;
  o.weights = "q5_1";
  EXPECT_THROW(pipeline::write_random_folder((tmp.path() / "a").string(), spec, o),
               InvalidArgument);
  EXPECT_FALSE(fs::exists(tmp.path() / "a"));
  EXPECT_FALSE(fs::exists(tmp.path() / "a.partial"));
  // A folder with something in it is not overwritten.
  fs::create_directories(tmp.path() / "b");
  std::ofstream(tmp.path() / "b" / "keep.txt") << "mine";
  o.weights = "bf16";
  EXPECT_THROW(pipeline::write_random_folder((tmp.path() / "b").string(), spec, o),
               InvalidArgument);
  EXPECT_TRUE(fs::exists(tmp.path() / "b" / "keep.txt"));
  EXPECT_FALSE(fs::exists(tmp.path() / "b" / "model_index.json"));
  // A network the writer cannot build fails before the folder appears.
  auto broken = spec;
  broken.denoiser["num_attention_heads"] = -1;
  EXPECT_ANY_THROW(pipeline::write_random_folder((tmp.path() / "c").string(), broken, o));
  EXPECT_FALSE(fs::exists(tmp.path() / "c"));
  EXPECT_FALSE(fs::exists(tmp.path() / "c.partial"));
}

// A weight file cut short (a copy or download that stopped) is found by the memory plan, before
// any network loads, whichever network it belongs to: a GGUF transformer, which loads only after
// the text encoders ran, and a text encoder's safetensors file. One error naming the file; the
// CLI writes no image.
TEST(RealSizeModel, ATruncatedWeightFileIsRefusedByThePlanBeforeAnythingLoads) {
  const auto golden = test::hidream_golden_dir();
  if (!fs::exists(golden + "/cases.json")) GTEST_SKIP() << "no golden set at " << golden;
  const fs::path model = verify::GoldenSet::load(golden).model_dir();
  test::TempDir tmp;
  const auto dir = tmp.path() / "model";
  fs::copy(model, dir, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(dir / "transformer"))
    if (e.path().filename() != "config.json") fs::remove(e.path());
  pipeline::RandomFolderOptions o;
  o.weights = "q8_0";
  pipeline::write_random_component(dir.string(), "transformer", "hidream",
                                   read_json(dir / "transformer" / "config.json"), o);
  const auto gguf = dir / "transformer" / "diffusion_pytorch_model.gguf";
  ASSERT_TRUE(fs::exists(gguf));
  {
    // Whole, it plans.
    pipeline::HiDreamPipeline pipe(io::ModelFolder::open(dir.string()), torch::kCPU,
                                   torch::kFloat32);
    pipe.plan(64, 64, 0, {});
  }
  fs::resize_file(gguf, fs::file_size(gguf) * 2 / 3);
  pipeline::HiDreamPipeline pipe(io::ModelFolder::open(dir.string()), torch::kCPU, torch::kFloat32);
  auto what = test::expect_throw<FormatError>([&] { pipe.plan(64, 64, 0, {}); });
  EXPECT_NE(what.find("diffusion_pytorch_model.gguf"), std::string::npos) << what;
  EXPECT_NE(what.find("truncated"), std::string::npos) << what;

  const auto out = tmp.file("out.png");
  const auto r =
      test::run_cli({"txt2img", "-m", dir.string(), "-p", "a fox", "--steps", "1", "-o", out}, tmp);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("diffusion_pytorch_model.gguf"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));

  const auto llama = dir / "text_encoder_4" / "model.safetensors";
  ASSERT_TRUE(fs::exists(llama));
  fs::remove_all(dir / "transformer");
  fs::copy(model / "transformer", dir / "transformer", fs::copy_options::recursive);
  fs::resize_file(llama, fs::file_size(llama) - 100);
  pipeline::HiDreamPipeline second(io::ModelFolder::open(dir.string()), torch::kCPU,
                                   torch::kFloat32);
  what = test::expect_throw<FormatError>([&] { second.plan(64, 64, 0, {}); });
  EXPECT_NE(what.find("text_encoder_4"), std::string::npos) << what;
}

// A disk that fills while a folder is written, mid-stream: here a file-size limit on the CLI
// (its writes then fail with EFBIG, as they would with ENOSPC) while it writes a real-size
// SD2.1-base folder (2.4 GiB: any test machine's disk passes the writer's free-space check, which
// a FLUX folder's 31 GiB did not always), whose text encoder is larger than the limit. A
// one-line error, no crash, and neither the folder nor its .partial left behind to be loaded
// later.
TEST(RealSizeModel, AWriteThatFailsMidwayLeavesNoFolder) {
  test::TempDir tmp;
  const auto out = tmp.file("sd21-base");
  const auto r = test::run_cli({"create-demo-model", "--arch", "sd2.1-base", "-o", out}, tmp,
                               "trap '' XFSZ; ulimit -f 16384;");  // 8 MiB, in 512-byte blocks
  EXPECT_GT(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("text_encoder"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));
}

}  // namespace test_real_size_model
}  // namespace diffuse
