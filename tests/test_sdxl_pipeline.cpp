// Stable Diffusion XL through the Stable Diffusion engine: the golden pipeline cases (base
// text-to-image and img2img, refiner img2img), the time ids, the empty negative prompt's zeros,
// folders whose parts do not fit together, and the base -> refiner handoff (denoising_end /
// denoising_start).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "diffuse/errors.h"
#include "diffuse/pipeline.h"
#include "pipeline/denoising_range.h"
#include "pipeline/sdxl_conditioning.h"
#include "pipeline/stable_diffusion.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_sdxl_pipeline {

namespace fs = std::filesystem;

std::string set_dir() {
  return test::sdxl_golden_dir();
}

bool have_set() {
  return fs::exists(set_dir() + "/cases.json");
}

// A copy of one of the set's model folders, to change.
fs::path copy_model(const test::TempDir& dir, const std::string& name = "model") {
  const fs::path to = dir.path() / name;
  fs::copy(fs::path(set_dir()) / name, to, fs::copy_options::recursive);
  return to;
}

void edit_json(const fs::path& file, const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json j;
  {
    std::ifstream in(file);
    in >> j;
  }
  change(j);
  std::ofstream(file) << j.dump(2);
}

LoadOptions fp32() {
  LoadOptions o;
  o.dtype = "fp32";
  o.vae_dtype = "fp32";
  return o;
}

void load(const fs::path& model) {
  pipeline::StableDiffusion sd(model.string(), fp32());
}

GenerationConfig small_run(const std::string& prompt) {
  GenerationConfig g;
  g.prompts = {prompt};
  g.width = 64;
  g.height = 48;
  g.steps = 2;
  g.guidance_scale = 5.0;
  g.seed = 7;
  return g;
}

TEST(SdxlPipeline, GoldenPipelineCasesPass) {
  if (!have_set()) GTEST_SKIP() << "no set at " << set_dir();
  verify::VerifyOptions o;
  o.components = {"pipeline"};
  const auto set = verify::GoldenSet::load(set_dir());
  const auto results = verify::run_all(set, o);
  ASSERT_FALSE(results.empty());
  for (const auto& r : results) {
    EXPECT_TRUE(r.passed) << r.name << ": " << r.reason;
    // Every tensor the reference recorded was compared (embeddings, time ids, token ids, each
    // step's UNet input and output, latents, image), not only the final image.
    const auto* c = set.find(r.name);
    ASSERT_NE(c, nullptr);
    for (const auto& [name, spec] : c->raw.at("outputs").items()) {
      bool compared = false;
      for (const auto& d : r.details) compared = compared || d.rfind(name + ":", 0) == 0;
      EXPECT_TRUE(compared) << r.name << ": " << name << " was not compared";
    }
  }
}

TEST(SdxlPipeline, TimeIdsAreTheImageSizeUnlessToldOtherwise) {
  pipeline::SdxlOptions base, refiner;
  refiner.requires_aesthetics_score = true;
  SizeConditioning c;
  using V = std::vector<double>;
  EXPECT_EQ(pipeline::sdxl_time_ids(c, base, 48, 64, false), (V{48, 64, 0, 0, 48, 64}));
  EXPECT_EQ(pipeline::sdxl_time_ids(c, base, 48, 64, true), (V{48, 64, 0, 0, 48, 64}));
  EXPECT_EQ(pipeline::sdxl_time_ids(c, refiner, 48, 64, false), (V{48, 64, 0, 0, 6.0}));
  EXPECT_EQ(pipeline::sdxl_time_ids(c, refiner, 48, 64, true), (V{48, 64, 0, 0, 2.5}));
  c.original_width = 2048;
  c.original_height = 1536;
  c.crop_top = 16;
  c.crop_left = 32;
  c.target_width = 1024;
  c.target_height = 768;
  c.aesthetic_score = 7;
  // The negative branch keeps the positive crops (diffusers does the same).
  EXPECT_EQ(pipeline::sdxl_time_ids(c, base, 48, 64, true), (V{1536, 2048, 16, 32, 768, 1024}));
  EXPECT_EQ(pipeline::sdxl_time_ids(c, refiner, 48, 64, false), (V{1536, 2048, 16, 32, 7}));

  SizeConditioning bad;
  bad.crop_left = -1;
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              pipeline::validate_size_conditioning(bad);
            }).find("crop left"),
            std::string::npos);
  bad = {};
  bad.aesthetic_score = std::nan("");
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              pipeline::validate_size_conditioning(bad);
            }).find("aesthetic score"),
            std::string::npos);
}

// Base models guide against zeros when no negative prompt is given (force_zeros_for_empty_prompt);
// an explicit '' is encoded, and a refiner encodes '' for a missing one.
TEST(SdxlPipeline, AMissingNegativePromptIsZerosOnlyWhereTheFolderSaysSo) {
  if (!have_set()) GTEST_SKIP() << "no set at " << set_dir();
  pipeline::StableDiffusion base(set_dir() + "/model", fp32());
  const auto none = base.encode_prompt({"a red fox"}, {}, 1, true);
  ASSERT_TRUE(none.negative.defined() && none.negative_pooled.defined());
  EXPECT_EQ(none.negative.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(none.negative_pooled.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(none.positive.size(-1), 40);  // CLIP-L 16 + CLIP-G 24, side by side
  EXPECT_EQ(none.pooled.sizes(), (std::vector<int64_t>{1, 20}));
  const auto empty = base.encode_prompt({"a red fox"}, {""}, 1, true);
  EXPECT_GT(empty.negative.abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(empty.positive, none.positive));
  // Two images per prompt: every embedding repeated alike.
  const auto two = base.encode_prompt({"a red fox"}, {}, 2, true);
  EXPECT_EQ(two.pooled.size(0), 2);
  EXPECT_EQ(two.negative_pooled.size(0), 2);

  pipeline::StableDiffusion refiner(set_dir() + "/model_refiner", fp32());
  const auto r = refiner.encode_prompt({"a red fox"}, {}, 1, true);
  EXPECT_EQ(r.positive.size(-1), 24);  // CLIP-G only
  EXPECT_GT(r.negative.abs().max().item<float>(), 0.0f);
  EXPECT_GT(r.negative_pooled.abs().max().item<float>(), 0.0f);
}

TEST(SdxlPipeline, SizeConditioningReachesTheUNet) {
  if (!have_set()) GTEST_SKIP() << "no set at " << set_dir();
  pipeline::StableDiffusion sd(set_dir() + "/model", fp32());
  std::map<std::string, torch::Tensor> traced;
  sd.set_trace([&](const std::string& name, const torch::Tensor& t) { traced[name] = t.clone(); });
  auto g = small_run("a blue square");
  const auto plain = sd.text2image(g, {});
  ASSERT_TRUE(traced.count("add_time_ids_cfg"));
  EXPECT_TRUE(torch::equal(traced.at("add_time_ids_cfg"),
                           torch::tensor({48.0f, 64.0f, 0.0f, 0.0f, 48.0f, 64.0f}).repeat({2, 1})));
  g.size_conditioning.crop_top = 256;
  const auto cropped = sd.text2image(g, {});
  EXPECT_FALSE(torch::equal(plain.latents, cropped.latents));
  g.size_conditioning.crop_top = -4;
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] { sd.text2image(g, {}); }).find("crop top"),
            std::string::npos);
}

// A1111's syntax on both encoders: weights of 1 are the plain prompt, other weights and long
// prompts change the embeddings (chunks of 77 side by side), the pooled one comes from the
// first chunk.
TEST(SdxlPipeline, A1111WeightsAndChunksWorkOnBothEncoders) {
  if (!have_set()) GTEST_SKIP() << "no set at " << set_dir();
  pipeline::StableDiffusion sd(set_dir() + "/model", fp32());
  const auto plain = sd.encode_prompt({"a red fox"}, {}, 1, true, "plain");
  const auto ones = sd.encode_prompt({"a (red:1.0) fox"}, {}, 1, true, "a1111");
  EXPECT_TRUE(torch::equal(plain.positive, ones.positive));
  EXPECT_TRUE(torch::equal(plain.pooled, ones.pooled));
  const auto heavy = sd.encode_prompt({"a (red:1.5) fox"}, {}, 1, true, "a1111");
  ASSERT_EQ(heavy.positive.sizes(), plain.positive.sizes());
  EXPECT_FALSE(torch::allclose(heavy.positive, plain.positive));
  EXPECT_EQ(heavy.negative.abs().max().item<float>(), 0.0f);  // no negative prompt: zeros
  EXPECT_EQ(heavy.negative_pooled.abs().max().item<float>(), 0.0f);
  const auto two_chunks =
      sd.encode_prompt({"a red fox BREAK in the snow"}, {"blurry"}, 1, true, "a1111");
  EXPECT_EQ(two_chunks.positive.size(1), 2 * plain.positive.size(1));
  EXPECT_EQ(two_chunks.positive.size(2), 40);
  EXPECT_EQ(two_chunks.negative.sizes(), two_chunks.positive.sizes());
  EXPECT_GT(two_chunks.negative.abs().max().item<float>(), 0.0f);
  // The pooled embedding is the first chunk's: "a red fox" alone.
  const auto first = sd.encode_prompt({"a red fox"}, {"blurry"}, 1, true, "plain");
  EXPECT_TRUE(torch::allclose(two_chunks.pooled, first.pooled, 1e-5, 1e-6));
  auto g = small_run("a (red:1.3) fox BREAK snow");
  g.prompt_syntax = "a1111";
  EXPECT_EQ(sd.text2image(g, {}).images.size(), 1u);
}

TEST(SdxlPipeline, FoldersWhosePartsDoNotFitAreRefusedAtLoad) {
  if (!have_set()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir dir;
  // A base UNet behind a refiner's index: 5 time ids do not fill its added embedding.
  auto model = copy_model(dir);
  edit_json(model / "model_index.json",
            [](nlohmann::json& j) { j["requires_aesthetics_score"] = true; });
  auto msg = test::expect_throw<ConfigError>([&] { load(model); });
  EXPECT_NE(msg.find("requires_aesthetics_score"), std::string::npos) << msg;
  EXPECT_NE(msg.find("projection_class_embeddings_input_dim"), std::string::npos) << msg;
  // No CLIP-G: nothing makes the pooled embedding.
  fs::remove_all(model);
  model = copy_model(dir);
  fs::remove_all(model / "text_encoder_2");
  msg = test::expect_throw<ConfigError>([&] { load(model); });
  EXPECT_NE(msg.find("text_encoder_2"), std::string::npos) << msg;
  // CLIP-G without its tokenizer.
  fs::remove_all(model);
  model = copy_model(dir);
  fs::remove_all(model / "tokenizer_2");
  msg = test::expect_throw<IoError>([&] { load(model); });
  EXPECT_NE(msg.find("tokenizer_2"), std::string::npos) << msg;
  // Encoders narrower than the UNet's cross attention.
  fs::remove_all(model);
  model = copy_model(dir);
  edit_json(model / "unet" / "config.json",
            [](nlohmann::json& j) { j["cross_attention_dim"] = 48; });
  msg = test::expect_throw<ConfigError>([&] { load(model); });
  EXPECT_NE(msg.find("cross_attention_dim is 48"), std::string::npos) << msg;
  EXPECT_NE(msg.find("text_encoder 16 + text_encoder_2 24"), std::string::npos) << msg;
}

TEST(SdxlPipeline, TheCliDrawsAnImageWithTheModelsDefaults) {
  if (!have_set()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir dir;
  const auto out = dir.file("xl.png");
  auto r = test::run_cli(
      {"txt2img", "-m", set_dir() + "/model", "-p", "a red fox", "--steps", "2", "-s", "1",
       "--original-size", "1024x768", "--crop-top-left", "0,32", "-o", out, "-q"},
      dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out));
  r = test::run_cli({"txt2img", "-m", set_dir() + "/model", "-p", "x", "--original-size", "1024",
                     "-o", out, "-q"},
                    dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--original-size"), std::string::npos) << r.err;
  r = test::run_cli({"img2img", "-m", set_dir() + "/model_refiner", "-i", out, "-p", "a red fox",
                     "--steps", "3", "--strength", "0.5", "--aesthetic-score", "7", "-s", "1", "-o",
                     dir.file("refined.png"), "-q"},
                    dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir.file("refined.png")));
}

// diffusers' cut, Python's rounding included: int(round(10 - 0.35 * 10)) = round(6.5) = 6.
TEST(SdxlHandoff, TheRangeCutsAsDiffusersDoes) {
  const auto ts = torch::arange(9, -1, -1, torch::kFloat32);  // 9, 8, ..., 0
  auto r = pipeline::denoising_range(ts, 10, 1, 0, 0.35);
  EXPECT_EQ(r.begin, 0);
  EXPECT_EQ(r.end, 4);  // 9, 8, 7, 6 (t >= 6)
  r = pipeline::denoising_range(ts, 10, 1, 0.35, 1);
  EXPECT_EQ(r.begin, 4);  // 5 .. 0 (t < 6)
  EXPECT_EQ(r.end, 10);
  r = pipeline::denoising_range(ts, 10, 2, 0.35, 1);  // a second-order scheduler: one more
  EXPECT_EQ(r.begin, 3);
  r = pipeline::denoising_range(ts, 10, 1, 0, 1, 7);  // strength's start, nothing cut
  EXPECT_EQ(r.begin, 7);
  EXPECT_EQ(r.end, 10);
}

// Base with denoising_end, then image-to-image from its latents with denoising_start, is the
// whole run (Euler: the split changes nothing); the refiner continues the same latents; what
// cannot work is refused, naming it.
TEST(SdxlHandoff, BaseThenContinuationIsTheWholeRunAndTheRefinerContinues) {
  if (!have_set()) GTEST_SKIP() << "no set at " << set_dir();
  auto base = Text2Image::load(set_dir() + "/model", fp32());
  auto g = small_run("a red fox");
  g.steps = 6;
  const auto whole = base.generate(g);
  g.denoising_end = 0.5;
  const auto first = base.generate(g);
  EXPECT_TRUE(first.images.empty());
  ASSERT_TRUE(first.latents.defined());
  EXPECT_GT(first.steps_run, 0);
  EXPECT_LT(first.steps_run, 6);

  auto cont = Image2Image::load(set_dir() + "/model", fp32());
  auto h = small_run("a red fox");
  h.steps = 6;
  h.denoising_start = 0.5;
  h.latents = first.latents;
  const auto second = cont.generate(h, Image{});
  EXPECT_EQ(first.steps_run + second.steps_run, 6);
  EXPECT_TRUE(torch::equal(second.latents, whole.latents));
  ASSERT_EQ(second.images.size(), 1u);
  EXPECT_EQ(second.images[0].rgb, whole.images[0].rgb);

  auto refiner = Image2Image::load(set_dir() + "/model_refiner", fp32());
  const auto refined = refiner.generate(h, Image{});
  ASSERT_EQ(refined.images.size(), 1u);
  EXPECT_TRUE(torch::isfinite(refined.latents).all().item<bool>());
  EXPECT_FALSE(torch::equal(refined.latents, whole.latents));

  auto message = [](auto f) { return test::expect_throw<InvalidArgument>(f); };
  auto bad = h;
  bad.latents = torch::Tensor();
  EXPECT_NE(message([&] { cont.generate(bad, Image{}); }).find("give them"), std::string::npos);
  bad = h;
  bad.denoising_end = 0.4;
  EXPECT_NE(message([&] { cont.generate(bad, Image{}); }).find("must be below"), std::string::npos);
  bad = h;
  bad.latents = first.latents.narrow(1, 0, 2);
  EXPECT_NE(message([&] { cont.generate(bad, Image{}); }).find("given latents have shape"),
            std::string::npos);
  auto t2i = g;
  t2i.denoising_end = 1;
  t2i.denoising_start = 0.5;
  EXPECT_NE(message([&] { base.generate(t2i); }).find("image-to-image takes them"),
            std::string::npos);
  t2i.denoising_start = 0;
  t2i.denoising_end = 0.01;  // ends before the first step
  EXPECT_NE(message([&] { base.generate(t2i); }).find("leaves no denoising step"),
            std::string::npos);
}

TEST(SdxlHandoff, TheCliWritesTheLatentsAndContinuesThem) {
  if (!have_set()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir dir;
  const auto latents = dir.file("base.safetensors");
  auto r =
      test::run_cli({"txt2img", "-m", set_dir() + "/model", "-p", "a red fox", "--steps", "4", "-W",
                     "64", "-H", "48", "-s", "3", "--denoising-end", "0.5", "-o", latents, "-q"},
                    dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(latents));
  r = test::run_cli(
      {"img2img", "-m", set_dir() + "/model_refiner", "-p", "a red fox", "--steps", "4", "-s", "3",
       "--denoising-start", "0.5", "--latents", latents, "-o", dir.file("refined.png"), "-q"},
      dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir.file("refined.png")));
  // Latents are no PNG, a continuation needs them, and not an image as well.
  r = test::run_cli({"txt2img", "-m", set_dir() + "/model", "-p", "x", "--denoising-end", "0.5",
                     "-o", dir.file("x.png"), "-q"},
                    dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("name a .safetensors file"), std::string::npos) << r.err;
  r = test::run_cli({"img2img", "-m", set_dir() + "/model", "-p", "x", "--denoising-start", "0.5",
                     "-o", dir.file("y.png"), "-q"},
                    dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--latents FILE"), std::string::npos) << r.err;
  r = test::run_cli(
      {"img2img", "-m", set_dir() + "/model", "-p", "x", "--denoising-start", "0.5", "--latents",
       latents, "-i", dir.file("refined.png"), "-o", dir.file("y.png"), "-q"},
      dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("one or the other"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("y.png")));
}

}  // namespace test_sdxl_pipeline
}  // namespace diffuse
