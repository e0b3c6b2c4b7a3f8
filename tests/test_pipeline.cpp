// Library-level pipeline behaviour beyond the golden replay: seeds, batching, callbacks,
// cancellation and bad parameters.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "diffuse/pipeline.h"
#include "pipeline/stable_diffusion.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_pipeline {

using test::fp32_cpu;

GenerationConfig small_config(int steps = 2) {
  GenerationConfig g;
  g.prompts = {"a red fox"};
  g.steps = steps;
  g.width = 64;
  g.height = 64;
  g.seed = 1234;
  return g;
}

// Values of torch.randn(shape, generator=torch.Generator("cpu").manual_seed(1234)) computed
// with PyTorch 1.13 (diffusers draws the initial latents exactly so).
TEST(Pipeline, SeedGivesTheReferenceInitialLatents) {
  pipeline::StableDiffusion sd(test::golden_model_dir(), fp32_cpu());
  torch::Tensor initial;
  sd.set_trace([&](const std::string& name, const torch::Tensor& t) {
    if (name == "initial_latents") initial = t.clone();
  });
  auto g = small_config(1);
  g.prompts = {"a", "b"};
  g.width = 128;
  g.height = 64;
  sd.text2image(g, {});
  ASSERT_TRUE(initial.defined());
  ASSERT_EQ(initial.sizes(), (std::vector<int64_t>{2, 4, 8, 16}));
  auto flat = initial.flatten();
  const float expected[] = {-0.111719f, -0.49659f, 0.163074f, -0.881688f, 0.0539f, 0.668374f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(flat[i].item<float>(), expected[i], 1e-6) << i;
  EXPECT_NEAR(flat[-1].item<float>(), -0.352716f, 1e-6);
  EXPECT_NEAR(initial.sum().item<double>(), -81.4714, 1e-3);
}

TEST(Pipeline, SameSeedSameImageDifferentSeedDifferentImage) {
  auto pipe = Text2Image::load(test::golden_model_dir(), fp32_cpu());
  auto a = pipe.generate(small_config());
  auto b = pipe.generate(small_config());
  auto g = small_config();
  g.seed = 99;
  auto c = pipe.generate(g);
  ASSERT_EQ(a.images.size(), 1u);
  EXPECT_EQ(a.images[0].rgb, b.images[0].rgb);
  EXPECT_NE(a.images[0].rgb, c.images[0].rgb);
  EXPECT_EQ(a.seed, 1234u);
  EXPECT_EQ(a.images[0].width, 64);
  EXPECT_EQ(a.timings.step_s.size(), a.timings.step_s.size());
  EXPECT_GT(a.timings.peak_rss_bytes, 0);
}

TEST(Pipeline, ImagesPerPromptAndSchedulersProduceTheRightBatch) {
  auto pipe = Text2Image::load(test::golden_model_dir(), fp32_cpu());
  for (const auto& name : scheduler_names()) {
    auto g = small_config(3);
    g.prompts = {"one", "two"};
    g.negative_prompts = {"blurry"};
    g.images_per_prompt = 2;
    g.scheduler = name;
    auto r = pipe.generate(g);
    ASSERT_EQ(r.images.size(), 4u) << name;
    EXPECT_EQ(r.latents.size(0), 4) << name;
    EXPECT_TRUE(torch::isfinite(r.images_float).all().item<bool>()) << name;
  }
}

TEST(Pipeline, CallbackSeesEveryStepAndCanCancel) {
  auto pipe = Text2Image::load(test::golden_model_dir(), fp32_cpu());
  std::vector<int> steps;
  auto r = pipe.generate(small_config(3), [&](const StepEvent& e) {
    steps.push_back(e.step);
    EXPECT_EQ(e.latents->size(1), 4);
    return true;
  });
  EXPECT_EQ(steps.size(), r.timings.step_s.size());
  EXPECT_EQ(steps.front(), 0);
  int calls = 0;
  EXPECT_THROW(pipe.generate(small_config(3), [&](const StepEvent&) { return ++calls < 2; }),
               Cancelled);
  EXPECT_EQ(calls, 2);
}

TEST(Pipeline, Image2ImageKeepsSizeAndUsesStrength) {
  auto pipe = Image2Image::load(test::golden_model_dir(), fp32_cpu());
  Image init;
  init.width = 77;  // not a multiple of 8: rounded down to 72 (latent 9 wide: odd for the UNet)
  init.height = 64;
  init.rgb.assign(77 * 64 * 3, 128);
  auto g = small_config(4);
  g.width = 0;
  g.height = 0;
  g.strength = 0.5;
  g.scheduler = "ddim";  // one timestep per step (PNDM's PLMS schedule has an extra one)
  std::vector<int> steps;
  auto r = pipe.generate(g, init, [&](const StepEvent& e) {
    steps.push_back(e.step);
    return true;
  });
  ASSERT_EQ(r.images.size(), 1u);
  EXPECT_EQ(r.images[0].width, 72);
  EXPECT_EQ(r.images[0].height, 64);
  EXPECT_EQ(steps.size(), 2u);  // strength 0.5 of 4 steps
}

// Offload and a single generation (the CLI's one run: networks loaded per stage, the default's
// packing kept) give the resident pipeline's images, also on a run that loads them again.
TEST(Pipeline, OffloadGivesBitIdenticalImagesAcrossRepeatedRuns) {
  auto resident = Text2Image::load(test::golden_model_dir(), fp32_cpu());
  EXPECT_FALSE(resident.info().offload);
  auto g = small_config(2);
  const auto expected = resident.generate(g);
  Image init;
  init.width = init.height = 64;
  init.rgb.assign(64 * 64 * 3, 90);
  auto g2 = g;
  g2.strength = 0.5;
  const auto i2i_expected =
      Image2Image::load(test::golden_model_dir(), fp32_cpu()).generate(g2, init);
  for (bool single : {false, true}) {
    SCOPED_TRACE(single ? "single_generation" : "offload");
    auto options = fp32_cpu();
    (single ? options.single_generation : options.offload) = true;
    auto lazy = Text2Image::load(test::golden_model_dir(), options);
    EXPECT_TRUE(lazy.info().offload);
    EXPECT_EQ(lazy.info().weight_bytes, 0);
    EXPECT_EQ(lazy.info().default_width, resident.info().default_width);
    for (int run = 0; run < 2; ++run) {  // the second run reloads every network
      auto got = lazy.generate(g);
      EXPECT_TRUE(got.images_float.equal(expected.images_float))
          << "run " << run << ": max |diff| "
          << (got.images_float - expected.images_float).abs().max().item<float>();
    }
    // img2img loads the VAE twice per run (encode, then decode).
    auto i2i_got = Image2Image::load(test::golden_model_dir(), options).generate(g2, init);
    EXPECT_TRUE(i2i_got.images_float.equal(i2i_expected.images_float))
        << "max |diff| "
        << (i2i_got.images_float - i2i_expected.images_float).abs().max().item<float>();
  }
}

TEST(Pipeline, BadParametersAreRejectedBeforeAnyWork) {
  auto pipe = Text2Image::load(test::golden_model_dir(), fp32_cpu());
  auto expect_invalid = [&](GenerationConfig g, const std::string& needle) {
    try {
      pipe.generate(g);
      FAIL() << "expected InvalidArgument mentioning " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto g = small_config();
  g.width = 60;
  expect_invalid(g, "multiples of 8");
  g = small_config();
  g.steps = 0;
  expect_invalid(g, "steps");
  g = small_config();
  g.prompts.clear();
  expect_invalid(g, "prompt");
  g = small_config();
  g.negative_prompts = {"a", "b", "c"};
  expect_invalid(g, "negative");
  g = small_config();
  g.latents = torch::zeros({1, 4, 3, 3});
  expect_invalid(g, "latents");
  g = small_config();
  g.scheduler = "warp-drive";
  EXPECT_THROW(pipe.generate(g), Error);
  auto i2i = Image2Image::load(test::golden_model_dir(), fp32_cpu());
  Image init;
  init.width = init.height = 64;
  init.rgb.assign(64 * 64 * 3, 0);
  g = small_config();
  g.strength = 1.5;
  EXPECT_THROW(i2i.generate(g, init), InvalidArgument);
  g.strength = 0;
  EXPECT_THROW(i2i.generate(g, init), InvalidArgument);
}

TEST(Pipeline, WarnsWhenAPromptIsTruncated) {
  auto pipe = Text2Image::load(test::golden_model_dir(), fp32_cpu());
  auto g = small_config(1);
  auto r = pipe.generate(g);
  EXPECT_TRUE(r.warnings.empty());
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "cat ";
  g.prompts = {"short", long_prompt};
  r = pipe.generate(g);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("prompt 2"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("truncated"), std::string::npos) << r.warnings[0];
}

TEST(Pipeline, MissingModelIsAnIoError) {
  EXPECT_THROW(Text2Image::load("/nonexistent/model", fp32_cpu()), IoError);
  LoadOptions o = fp32_cpu();
  o.device = "tpu";
  EXPECT_THROW(Text2Image::load(test::golden_model_dir(), o), DeviceError);
}

}  // namespace test_pipeline
}  // namespace diffuse

namespace diffuse {
namespace test_pipeline {

// AUTOMATIC1111's prompt syntax through the pipeline (the demo model: real CLIP-style
// tokenizer, 77-token text encoder).
TEST(PipelinePromptSyntax, PlainPromptsAreExactWeightsAndLongPromptsChangeTheImage) {
  LoadOptions lo;
  lo.device = "cpu";
  auto t2i = Text2Image::load(std::string(DIFFUSE_SOURCE_DIR) + "/models/demo", lo);
  auto run = [&](const std::string& prompt, const std::string& syntax) {
    GenerationConfig g;
    g.prompts = {prompt};
    g.negative_prompts = {"blurry"};
    g.steps = 2;
    g.seed = 5;
    g.prompt_syntax = syntax;
    return t2i.generate(g);
  };
  const std::string plain = "a red circle on the left and a blue square on the right";
  EXPECT_EQ(run(plain, "a1111").images[0].rgb, run(plain, "plain").images[0].rgb);
  EXPECT_NE(
      run("a (red circle:1.6) on the left and a blue square on the right", "a1111").images[0].rgb,
      run(plain, "a1111").images[0].rgb);
  std::string longer = plain;
  for (int i = 0; i < 30; ++i) longer += ", and a green triangle";
  const auto truncated = run(longer, "plain");
  ASSERT_FALSE(truncated.warnings.empty());
  EXPECT_NE(truncated.warnings[0].find("truncated"), std::string::npos);
  const auto chunked = run(longer, "a1111");
  EXPECT_TRUE(chunked.warnings.empty()) << chunked.warnings[0];
  EXPECT_NE(chunked.images[0].rgb, truncated.images[0].rgb);
  EXPECT_THROW(run(plain, "compel"), InvalidArgument);
}

// Weights that all come out exactly 1 are A1111's plain prompt: the brackets are syntax, not
// text (issue 36: "(a red fox:1.0)" drew another image than "a red fox").
TEST(PipelinePromptSyntax, WeightsOfExactlyOneGiveThePlainPromptsImage) {
  LoadOptions lo;
  lo.device = "cpu";
  auto t2i = Text2Image::load(std::string(DIFFUSE_SOURCE_DIR) + "/models/demo", lo);
  auto run = [&](const std::string& prompt, const std::string& negative,
                 const std::string& syntax) {
    GenerationConfig g;
    g.prompts = {prompt};
    g.negative_prompts = {negative};
    g.steps = 2;
    g.seed = 7;
    g.prompt_syntax = syntax;
    return t2i.generate(g).images[0].rgb;
  };
  const std::string plain = "a red circle on the left and a blue square on the right";
  const auto want = run(plain, "blurry", "plain");
  for (const char* spelled : {"(a red circle on the left and a blue square on the right:1.0)",
                              "(a red circle on the left and a blue square on the right:1)",
                              "a red (circle:1.00) on the left and a blue square on the right",
                              "a red circle on the left and a ((blue square:1.0):1) on the right",
                              "a red circle on the left and a blue square on the right BREAK"}) {
    SCOPED_TRACE(spelled);
    EXPECT_EQ(run(spelled, "blurry", "a1111"), want);
  }
  EXPECT_EQ(run(plain, "(blurry:1.0)", "a1111"), want) << "the negative prompt too";
  EXPECT_NE(run("a red (circle:1.2) on the left and a blue square on the right", "blurry", "a1111"),
            want)
      << "a weight that is not 1 changes the image";
}

}  // namespace test_pipeline
}  // namespace diffuse
