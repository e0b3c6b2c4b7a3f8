// Qwen-Image and Qwen-Image-Edit (issue 66): every case of the qwen-image-tiny golden set
// through the verify code with every recorded output compared; the image processor's rounding;
// the CLI drawing and editing on the tiny folder; and bad input (a folder without the processor,
// a text encoder without its vision tower, sources smaller than a patch or too elongated, an
// edit on a text-to-image folder) refused with a clear error before the weights load.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "cli_run.h"
#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "golden_case_check.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "models/autoencoder_kl_qwenimage.h"
#include "models/qwen2_5_vl.h"
#include "models/qwenimage_transformer.h"
#include "pipeline/qwen_vl_image_processor.h"
#include "pipeline/qwenimage.h"
#include "pipeline/stable_diffusion.h"
#include "quant/ggml_blocks.h"
#include "rank_group_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_qwenimage {

namespace fs = std::filesystem;

std::string set_dir() {
  return test::qwen_image_golden_dir();
}
std::string model_dir() {
  return set_dir() + "/model";
}
bool have() {
  return fs::exists(set_dir() + "/cases.json");
}

// A copy of the tiny model folder: components linked, except `drop`; model_index.json with
// `pipeline_class`; text_encoder/config.json rewritten by `edit_text_config` when given.
std::string folder_copy(const test::TempDir& tmp, const std::string& drop,
                        const std::string& pipeline_class = "QwenImageEditPipeline",
                        bool without_vision_config = false) {
  const fs::path out = tmp.path() / "model";
  fs::create_directories(out);
  for (const auto& entry : fs::directory_iterator(model_dir())) {
    const auto name = entry.path().filename().string();
    if (!entry.is_directory() || name == drop) continue;
    if (name == "text_encoder" && without_vision_config) {
      fs::create_directories(out / name);
      for (const auto& f : fs::directory_iterator(entry.path()))
        if (f.path().filename() != "config.json")
          fs::create_symlink(f.path(), out / name / f.path().filename());
      auto cfg = io::JsonConfig::load((entry.path() / "config.json").string()).json();
      cfg.erase("vision_config");
      std::ofstream(out / name / "config.json") << cfg.dump(2);
      continue;
    }
    fs::create_directory_symlink(entry.path(), out / name);
  }
  auto index = io::JsonConfig::load(model_dir() + "/model_index.json").json();
  index["_class_name"] = pipeline_class;
  std::ofstream(out / "model_index.json") << index.dump(2);
  return out.string();
}

torch::Tensor noise_image(int64_t h, int64_t w) {
  auto gen = at::detail::createCPUGenerator(5);
  return torch::randint(0, 256, {h, w, 3}, gen, torch::kInt64).to(torch::kUInt8);
}

void write_png_of(const std::string& path, const torch::Tensor& u8) {
  Image img;
  img.height = static_cast<int>(u8.size(0));
  img.width = static_cast<int>(u8.size(1));
  const auto c = u8.contiguous();
  img.rgb.assign(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel());
  write_png(path, img);
}

TEST(QwenImageGolden, EveryCasePassesWithEveryOutputCompared) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::expect_golden_set_passes(set_dir());
}

TEST(QwenImageProcessor, SmartResizeRoundsHalvesToEvenAndKeepsThePixelBounds) {
  // 42 / 28 = 1.5 -> 2 and 70 / 28 = 2.5 -> 2 (Python's round), so both become 56.
  EXPECT_EQ(pipeline::qwen_smart_resize(42, 70, 28, 56, 1 << 30),
            std::make_pair(int64_t{56}, int64_t{56}));
  // Below min_pixels: scaled up, each side rounded up to the factor.
  const auto [h, w] = pipeline::qwen_smart_resize(30, 40, 28, 3136, 12845056);
  EXPECT_EQ(h, 56);
  EXPECT_EQ(w, 84);
  // Above max_pixels: scaled down inside the bound.
  const auto [bh, bw] = pipeline::qwen_smart_resize(4000, 3000, 28, 3136, 1000000);
  EXPECT_LE(bh * bw, 1000000);
  EXPECT_EQ(bh % 28, 0);
  EXPECT_EQ(bw % 28, 0);
  EXPECT_THROW(pipeline::qwen_smart_resize(10, 2100, 28, 3136, 12845056), InvalidArgument);
  EXPECT_THROW(pipeline::qwen_smart_resize(0, 20, 28, 3136, 12845056), InvalidArgument);
}

TEST(QwenImageProcessor, PatchesFollowTheGridOfTheResizedImage) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  const auto cfg = pipeline::QwenVLImageProcessorConfig::from_folder(model_dir() + "/processor");
  const auto out = pipeline::qwen_vl_preprocess(noise_image(100, 60), cfg);
  EXPECT_EQ(out.grid_thw[0], 1);
  EXPECT_EQ(out.pixel_values.size(0), out.grid_thw[1] * out.grid_thw[2]);
  EXPECT_EQ(out.pixel_values.size(1),
            3 * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size);
  EXPECT_THROW(pipeline::qwen_vl_preprocess(torch::zeros({8, 8}, torch::kUInt8), cfg),
               InvalidArgument);
}

TEST(QwenImageEditSize, SourceIsScaledToAboutOneMegapixelInMultiplesOf32) {
  // The golden set's 100x60 source became 1312x800.
  EXPECT_EQ(pipeline::QwenImagePipeline::edit_source_size(100, 60),
            std::make_pair(int64_t{1312}, int64_t{800}));
  EXPECT_EQ(pipeline::QwenImagePipeline::edit_source_size(512, 512),
            std::make_pair(int64_t{1024}, int64_t{1024}));
}

TEST(QwenImageBadInput, EditFolderWithoutProcessorIsRefusedBeforeLoading) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto dir = folder_copy(tmp, "processor");
  try {
    pipeline::QwenImagePipeline pipe(io::ModelFolder::open(dir), torch::kCPU, torch::kFloat32);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("processor"), std::string::npos) << e.what();
  }
}

TEST(QwenImageBadInput, EditWithATextEncoderWithoutVisionTowerIsRefused) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto dir = folder_copy(tmp, "", "QwenImageEditPipeline", /*without_vision_config=*/true);
  try {
    pipeline::QwenImagePipeline pipe(io::ModelFolder::open(dir), torch::kCPU, torch::kFloat32);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("vision tower"), std::string::npos) << e.what();
  }
}

TEST(QwenImageBadInput, SourcesSmallerThanAPatchOrTooElongatedAreRefused) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  pipeline::QwenImagePipeline pipe(io::ModelFolder::open(model_dir()), torch::kCPU,
                                   torch::kFloat32);
  pipeline::QwenImageEdit e;
  e.prompt = "x";
  e.sampling.steps = 1;
  for (const auto& [h, w, what] :
       {std::tuple<int64_t, int64_t, const char*>{10, 10, "at least"}, {14, 3000, "aspect"}}) {
    e.image = noise_image(h, w);
    try {
      pipe.edit(e);
      FAIL() << "no error for " << h << "x" << w;
    } catch (const InvalidArgument& err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
  }
}

TEST(QwenImageBadInput, PipelinesThatFeedTheModelsOtherwiseAreRefused) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto dir = folder_copy(tmp, "", "QwenImageEditPlusPipeline");
  try {
    pipeline::QwenImagePipeline pipe(io::ModelFolder::open(dir), torch::kCPU, torch::kFloat32);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("QwenImageEditPlusPipeline"), std::string::npos)
        << e.what();
  }
}

TEST(QwenImageBadInput, EditOnATextToImageFolderSaysWhatItNeeds) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto dir = folder_copy(tmp, "", "QwenImagePipeline");
  pipeline::QwenImagePipeline pipe(io::ModelFolder::open(dir), torch::kCPU, torch::kFloat32);
  EXPECT_FALSE(pipe.is_edit_model());
  pipeline::QwenImageEdit e;
  e.prompt = "x";
  e.image = noise_image(64, 64);
  EXPECT_THROW(pipe.edit(e), InvalidArgument);
}

TEST(QwenImageCli, DrawsAndEditsOnTheTinyFolder) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto drawn = tmp.file("drawn.png");
  auto r = test::run_cli({"txt2img", "-m", model_dir(), "-p", "a red house", "-W", "96", "-H", "64",
                          "--steps", "2", "--seed", "3", "-o", drawn, "--quiet"},
                         tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto img = read_png(drawn);
  EXPECT_EQ(img.width, 96);
  EXPECT_EQ(img.height, 64);
  // The same seed draws the same picture.
  const auto again = tmp.file("again.png");
  r = test::run_cli({"txt2img", "-m", model_dir(), "-p", "a red house", "-W", "96", "-H", "64",
                     "--steps", "2", "--seed", "3", "-o", again, "--quiet"},
                    tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_png(again).rgb, img.rgb);

  const auto source = tmp.file("source.png");
  write_png_of(source, noise_image(60, 100));
  const auto edited = tmp.file("edited.png");
  r = test::run_cli({"edit", "-m", model_dir(), "-p", "turn the sky orange", "-i", source,
                     "--steps", "2", "--seed", "4", "-o", edited, "--quiet"},
                    tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = read_png(edited);  // the ~1 MP size of the source's aspect ratio
  EXPECT_EQ(out.width, 1312);
  EXPECT_EQ(out.height, 800);
}

TEST(QwenImageCli, BadInputFailsWithAMessageAndNoOutput) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto tiny = tmp.file("tiny.png");
  write_png_of(tiny, noise_image(8, 8));
  const auto out = tmp.file("out.png");
  auto r = test::run_cli(
      {"edit", "-m", model_dir(), "-p", "x", "-i", tiny, "--steps", "2", "-o", out}, tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("at least 14 pixels"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // One step: shift_terminal cannot stretch a schedule that ends at pure noise.
  r = test::run_cli(
      {"txt2img", "-m", model_dir(), "-p", "x", "-W", "32", "-H", "32", "--steps", "1", "-o", out},
      tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("at least 2 steps"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  const auto source = tmp.file("source.png");
  write_png_of(source, noise_image(64, 64));
  r = test::run_cli(
      {"edit", "-m", model_dir(), "-p", "x", "-i", source, "--image-guidance", "2", "-o", out},
      tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--image-guidance"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

// A random model of other sizes than the golden set's: GQA with 3 heads on 1 key/value head,
// mRoPE sections (2, 1, 1), a 3-block vision tower with 4 heads and one full-attention block, a
// VAE with a factor of 4 and two residual blocks per stage, rotary axes (2, 2, 4): everything is
// read from the configs, so both pipelines run end to end (tokenizer, scheduler and processor
// are the golden set's).
std::string random_folder(const test::TempDir& tmp) {
  const fs::path out = tmp.path() / "other";
  fs::create_directories(out);
  for (const char* c : {"tokenizer", "processor", "scheduler"})
    fs::create_directory_symlink(fs::path(model_dir()) / c, out / c);
  auto index = io::JsonConfig::load(model_dir() + "/model_index.json").json();
  std::ofstream(out / "model_index.json") << index.dump(2);
  const auto save = [&](const std::string& component, const nlohmann::json& config,
                        torch::nn::Module& m, const std::string& file, uint64_t seed) {
    fs::create_directories(out / component);
    std::ofstream(out / component / "config.json") << config.dump(2);
    // Every parameter by its shape (the VAE's causal convolutions are modules of their own that
    // a generic initialiser does not know): matrices and kernels ~ N(0, 1/fan_in) scaled by 0.5,
    // vectors and norm scales around 1 or 0.
    auto gen = at::detail::createCPUGenerator(seed);
    torch::NoGradGuard no_grad;
    for (auto& p : m.named_parameters()) {
      auto& t = p.value();
      const bool scale = p.key().find("norm") != std::string::npos ||
                         p.key().find("gamma") != std::string::npos ||
                         p.key().find("ln_q") != std::string::npos;
      if (t.dim() >= 2 && !scale)
        t.copy_(torch::randn(t.sizes(), gen) * (0.5 / std::sqrt(double(t.numel() / t.size(0)))));
      else if (scale)
        t.copy_(1 + 0.1 * torch::randn(t.sizes(), gen));
      else
        t.copy_(0.05 * torch::randn(t.sizes(), gen));
    }
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    for (const auto& p : m.named_parameters()) tensors.emplace_back(p.key(), p.value());
    io::save_safetensors((out / component / file).string(), tensors);
  };
  const nlohmann::json te = {{"model_type", "qwen2_5_vl"},
                             {"hidden_size", 24},
                             {"intermediate_size", 32},
                             {"num_hidden_layers", 3},
                             {"num_attention_heads", 3},
                             {"num_key_value_heads", 1},
                             {"rms_norm_eps", 1e-6},
                             {"rope_theta", 1000000.0},
                             {"vocab_size", 151936},
                             {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}}},
                             {"image_token_id", 151655},
                             {"vision_start_token_id", 151652},
                             {"vision_config",
                              {{"depth", 3},
                               {"hidden_size", 16},
                               {"intermediate_size", 20},
                               {"num_heads", 4},
                               {"patch_size", 14},
                               {"temporal_patch_size", 2},
                               {"spatial_merge_size", 2},
                               {"window_size", 56},
                               {"fullatt_block_indexes", {2}},
                               {"out_hidden_size", 24}}}};
  models::Qwen2_5_VLForConditionalGeneration encoder(
      models::Qwen2_5_VLConfig::from_json(io::JsonConfig(te, "te")));
  save("text_encoder", te, *encoder, "model.safetensors", 1);
  nlohmann::json tr = {{"_class_name", "QwenImageTransformer2DModel"},
                       {"patch_size", 2},
                       {"in_channels", 32},
                       {"out_channels", 8},
                       {"num_layers", 3},
                       {"attention_head_dim", 8},
                       {"num_attention_heads", 3},
                       {"joint_attention_dim", 24},
                       {"axes_dims_rope", {2, 2, 4}}};
  models::QwenImageTransformer2DModel transformer(
      models::QwenImageTransformerConfig::from_json(io::JsonConfig(tr, "tr")));
  save("transformer", tr, *transformer, "diffusion_pytorch_model.safetensors", 2);
  nlohmann::json vae = {{"_class_name", "AutoencoderKLQwenImage"},
                        {"base_dim", 4},
                        {"z_dim", 8},
                        {"dim_mult", {1, 2, 2}},
                        {"num_res_blocks", 2},
                        {"attn_scales", nlohmann::json::array()},
                        {"temperal_downsample", {false, true}},
                        {"latents_mean", std::vector<double>(8, 0.1)},
                        {"latents_std", std::vector<double>(8, 1.5)}};
  models::AutoencoderKLQwenImage autoencoder(
      models::AutoencoderKLQwenImageConfig::from_json(io::JsonConfig(vae, "vae")));
  save("vae", vae, *autoencoder, "diffusion_pytorch_model.safetensors", 3);
  return out.string();
}

TEST(QwenImageOtherShapes, RandomModelOfOtherSizesDrawsAndEdits) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto dir = random_folder(tmp);
  pipeline::QwenImagePipeline pipe(io::ModelFolder::open(dir), torch::kCPU, torch::kFloat32);
  EXPECT_EQ(pipe.size_multiple(), 8);
  pipeline::QwenImageTextToImage t;
  t.prompt = "a small house";
  t.negative_prompt = " ";
  t.width = 40;
  t.height = 24;
  t.sampling.steps = 2;
  const auto drawn = pipe.text_to_image(t);
  EXPECT_EQ(drawn.image.sizes(), (std::vector<int64_t>{1, 24, 40, 3}));
  EXPECT_TRUE(torch::isfinite(drawn.image).all().item<bool>());
  pipeline::QwenImageEdit e;
  e.prompt = "make it blue";
  e.image = noise_image(30, 20);
  e.width = 48;
  e.height = 32;
  e.sampling.steps = 2;
  const auto edited = pipe.edit(e);
  EXPECT_EQ(edited.image.sizes(), (std::vector<int64_t>{1, 32, 48, 3}));
  EXPECT_TRUE(torch::isfinite(edited.image).all().item<bool>());
  // The source went in at ~1 MP: 832x1248 for 2:3, 26x39 tokens of a factor-4 VAE, 2x2 packed.
  ASSERT_EQ(edited.img_shapes.size(), 2u);
  EXPECT_EQ(edited.img_shapes[1], (models::QwenImageGrid{1, 1248 / 8, 832 / 8}));
}

// ComfyUI's single transformer file (the diffusers names under "model.diffusion_model.") loads
// through the prefix mapping and computes exactly what the folder's weights do; q8_0 blocks stay
// within the stated relative error.
TEST(QwenImageWeights, ComfyUiPrefixedFileAndQuantizedWeightsLoad) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  auto folder = io::ModelFolder::open(model_dir());
  std::vector<std::pair<std::string, torch::Tensor>> renamed;
  for (const auto& [key, value] : folder.component_weights("transformer"))
    renamed.emplace_back("model.diffusion_model." + key, value);
  const auto file = tmp.file("qwen_image_comfy.safetensors");
  io::save_safetensors(file, renamed);
  const auto x = torch::randn({1, 6, 64}), text = torch::randn({1, 5, 16});
  const std::vector<models::QwenImageGrid> grids{{1, 2, 3}};
  const auto t = torch::full({1}, 0.5);
  auto plain = models::load_qwenimage_transformer(folder, torch::kCPU, torch::kFloat32);
  const auto want = plain->forward(x, t, text, grids);
  auto other = io::ModelFolder::open(model_dir());
  const auto component = io::use_transformer_weights(other, file);
  auto comfy = models::load_qwenimage_transformer(other, torch::kCPU, torch::kFloat32, component);
  EXPECT_TRUE(torch::equal(comfy->forward(x, t, text, grids), want));
  auto q8 = models::load_qwenimage_transformer(folder, torch::kCPU, torch::kFloat32, "transformer",
                                               quant::GgmlType::Q8_0);
  const auto got = q8->forward(x, t, text, grids);
  EXPECT_LT((got - want).norm().item<double>() / want.norm().item<double>(), 0.05);
  EXPECT_FALSE(torch::equal(got, want));
  // Weights that do not fit the config: the error names the tensor and both shapes.
  renamed[0].second = torch::zeros({3, 3});
  io::save_safetensors(file, renamed);
  auto broken = io::ModelFolder::open(model_dir());
  const auto broken_component = io::use_transformer_weights(broken, file);
  try {
    models::load_qwenimage_transformer(broken, torch::kCPU, torch::kFloat32, broken_component);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
}

// Ulysses over 2 ranks (the tiny model's 2 heads, one each): every rank gets the one-device
// output, for a text-to-image sequence and an edit's two grids.
TEST(QwenImageUlysses, TwoRanksMatchOneDevice) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  SKIP_WITHOUT_CPU_COLLECTIVES();
  torch::NoGradGuard no_grad;
  auto model = models::load_qwenimage_transformer(io::ModelFolder::open(model_dir()), torch::kCPU,
                                                  torch::kFloat32);
  const auto text = torch::randn({1, 7, 16});
  const auto t = torch::full({1}, 0.6);
  for (const auto& grids : {std::vector<models::QwenImageGrid>{{1, 4, 6}},
                            std::vector<models::QwenImageGrid>{{1, 4, 4}, {1, 3, 5}}}) {
    int64_t tokens = 0;
    for (const auto& g : grids) tokens += g[1] * g[2];
    const auto x = torch::randn({1, tokens, 64});
    const auto one = model->forward(x, t, text, grids);
    std::mutex m;
    std::vector<torch::Tensor> outs;
    test::with_group(2, [&](parallel::RankGroup& g) {
      models::QwenImageForwardOptions o;
      o.sequence_group = &g;
      auto out = model->forward(x, t, text, grids, o);
      std::lock_guard<std::mutex> lock(m);
      outs.push_back(out);
    });
    ASSERT_EQ(outs.size(), 2u);
    for (const auto& out : outs)
      EXPECT_LE((out - one).abs().max().item<double>(), 1e-5 * one.abs().max().item<double>());
  }
}

// CFG-parallel on 2 ranks (one true-CFG branch each): every rank ends with the one-device
// picture, bit for bit (the same calls, only on different ranks).
TEST(QwenImageCfgParallel, TwoRanksDrawTheOneDevicePicture) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  SKIP_WITHOUT_CPU_COLLECTIVES();
  pipeline::QwenImageTextToImage t;
  t.prompt = "a small house";
  t.negative_prompt = "blurry";
  t.width = 48;
  t.height = 32;
  t.sampling.steps = 3;
  t.sampling.seed = 5;
  pipeline::QwenImagePipeline one(io::ModelFolder::open(model_dir()), torch::kCPU, torch::kFloat32);
  const auto want = one.text_to_image(t).image;
  std::mutex m;
  std::vector<torch::Tensor> images;
  test::with_group(2, [&](parallel::RankGroup& g) {
    pipeline::QwenImagePipeline pipe(io::ModelFolder::open(model_dir()), torch::kCPU,
                                     torch::kFloat32);
    pipe.set_cfg_group(std::shared_ptr<parallel::RankGroup>(&g, [](parallel::RankGroup*) {}));
    auto image = pipe.text_to_image(t).image;
    std::lock_guard<std::mutex> lock(m);
    images.push_back(image);
  });
  ASSERT_EQ(images.size(), 2u);
  for (const auto& image : images) EXPECT_TRUE(torch::equal(image, want));
  pipeline::QwenImagePipeline three(io::ModelFolder::open(model_dir()), torch::kCPU,
                                    torch::kFloat32);
  test::with_group(3, [&](parallel::RankGroup& g) {
    EXPECT_THROW(
        three.set_cfg_group(std::shared_ptr<parallel::RankGroup>(&g, [](parallel::RankGroup*) {})),
        InvalidArgument);
  });
}

// A peft LoRA on one projection of the transformer merges W + scale * B A.
TEST(QwenImageLora, PeftPairMergesIntoTheTransformer) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  pipeline::QwenImagePipeline pipe(io::ModelFolder::open(model_dir()), torch::kCPU,
                                   torch::kFloat32);
  const std::string module = "transformer_blocks.1.img_mod.1";
  const auto before = pipe.transformer()->named_parameters()[module + ".weight"].clone();
  auto gen = at::detail::createCPUGenerator(3);
  const auto down = torch::randn({2, before.size(1)}, gen);
  const auto up = torch::randn({before.size(0), 2}, gen);
  const auto file = tmp.file("lora.safetensors");
  io::save_safetensors(file, {{"transformer." + module + ".lora_A.weight", down},
                              {"transformer." + module + ".lora_B.weight", up}});
  pipe.add_lora(file, 0.5);
  const auto after = pipe.transformer()->named_parameters()[module + ".weight"];
  EXPECT_TRUE(torch::allclose(after, before + 0.5 * torch::matmul(up, down), 1e-5, 1e-5));
}

}  // namespace test_qwenimage
}  // namespace diffuse
