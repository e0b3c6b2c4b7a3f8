// The denoised estimate x0 that previews show and an interrupted generation decodes: exact for
// noised latents built from a known x0 (epsilon, v and sample prediction; fractional
// timesteps; flow matching), and the pipeline's finish_now() decodes it after the step it was
// asked at.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "pipeline/denoised_estimate.h"
#include "pipeline/hidream.h"
#include "test_util.h"
#include "verify/golden.h"

namespace diffuse {
namespace test_denoised_estimate {

// SD's scaled-linear schedule, as diffusers computes it.
torch::Tensor sd_alphas_cumprod() {
  auto betas = torch::linspace(std::sqrt(0.00085), std::sqrt(0.012), 1000, torch::kFloat64).pow(2);
  return torch::cumprod(1 - betas, 0).to(torch::kFloat32);
}

TEST(DenoisedEstimate, RecoversX0ForEveryPredictionType) {
  const auto alphas = sd_alphas_cumprod();
  auto gen = at::detail::createCPUGenerator(1);
  const auto x0 = torch::randn({2, 4, 8, 8}, gen, torch::kFloat64);
  const auto eps = torch::randn({2, 4, 8, 8}, gen, torch::kFloat64);
  for (double t : {0.0, 1.0, 401.0, 999.0, 617.25}) {
    SCOPED_TRACE(t);
    // The noise level at t, interpolated in sigma between the neighbouring training steps.
    const auto lo = static_cast<int64_t>(std::floor(t));
    const int64_t hi = std::min<int64_t>(lo + 1, 999);
    auto sigma = [&](int64_t i) {
      const double a = alphas[i].item<double>();
      return std::sqrt((1 - a) / a);
    };
    const double s = (hi - t) * sigma(lo) + (t - lo) * sigma(hi) + (lo == hi ? sigma(lo) : 0);
    const double a = 1 / (1 + s * s);
    const auto xt = std::sqrt(a) * x0 + std::sqrt(1 - a) * eps;
    const auto v = std::sqrt(a) * eps - std::sqrt(1 - a) * x0;
    // Bounded by float64 rounding of a few operations on values up to ~5 divided by sqrt(a).
    const double tol = 1e-9 / std::sqrt(a);
    EXPECT_LE(
        (pipeline::ddpm_denoised(xt, eps, t, alphas, "epsilon") - x0).abs().max().item<double>(),
        tol);
    EXPECT_LE(
        (pipeline::ddpm_denoised(xt, v, t, alphas, "v_prediction") - x0).abs().max().item<double>(),
        tol);
    EXPECT_TRUE(pipeline::ddpm_denoised(xt, x0, t, alphas, "sample").equal(x0));
  }
  EXPECT_THROW(pipeline::ddpm_denoised(x0, eps, 1000.5, alphas, "epsilon"), InvalidArgument);
  EXPECT_THROW(pipeline::ddpm_denoised(x0, eps, -1, alphas, "epsilon"), InvalidArgument);
  EXPECT_THROW(pipeline::ddpm_denoised(x0, eps, 5, alphas, "flow"), InvalidArgument);

  const double sigma = 0.7;
  const auto flow_xt = (1 - sigma) * x0 + sigma * eps;
  EXPECT_LE((pipeline::flow_denoised(flow_xt, eps - x0, sigma) - x0).abs().max().item<double>(),
            1e-12);
}

TEST(DenoisedEstimate, FinishNowDecodesTheStepsEstimate) {
  LoadOptions lo;
  lo.device = "cpu";
  auto t2i = Text2Image::load(std::string(DIFFUSE_SOURCE_DIR) + "/models/demo", lo);
  GenerationConfig g;
  g.prompts = {"a red circle on the left and a blue square on the right on a yellow background"};
  g.steps = 12;
  g.seed = 3;
  // Without guidance: a guided estimate overshoots in the first steps (measured: at step 4 of
  // 12, 10.3 from the final latents unguided, 70 at guidance 7.5, x_t 37).
  g.guidance_scale = 1.0;
  torch::Tensor at_stop;
  int calls = 0;
  auto result = t2i.generate(g, [&](const StepEvent& e) -> StepAction {
    ++calls;
    EXPECT_NE(e.denoised, nullptr);
    if (!e.denoised) return false;
    EXPECT_EQ(e.denoised->sizes(), e.latents->sizes());
    if (e.step + 1 < 4) return true;
    at_stop = e.denoised->to(torch::kCPU).clone();
    return StepAction::finish_now();
  });
  EXPECT_EQ(calls, 4);
  EXPECT_TRUE(result.interrupted);
  EXPECT_EQ(result.steps_run, 4);
  ASSERT_EQ(result.images.size(), 1u);
  EXPECT_TRUE(result.latents.equal(at_stop)) << "the image decodes step 4's estimate";
  bool warned = false;
  for (const auto& w : result.warnings) warned = warned || w.find("interrupted after step 4") == 0;
  EXPECT_TRUE(warned);

  // The estimate is what the finished image will be: step 4's is closer to the final latents
  // than step 4's x_t is (measured 10.3 against 37.4).
  torch::Tensor xt;
  auto full = t2i.generate(g, [&](const StepEvent& e) -> StepAction {
    if (e.step + 1 == 4) {
      EXPECT_TRUE(e.denoised->to(torch::kCPU).equal(at_stop)) << "the same run up to step 4";
      xt = e.latents->to(torch::kCPU).clone();
    }
    return true;
  });
  EXPECT_FALSE(full.interrupted);
  EXPECT_EQ(full.steps_run, 12);
  ASSERT_TRUE(xt.defined());
  const double from_x0 = (at_stop - full.latents).norm().item<double>();
  const double from_xt = (xt - full.latents).norm().item<double>();
  EXPECT_LT(from_x0, from_xt);
  EXPECT_THROW(t2i.generate(g, [](const StepEvent&) { return false; }), Cancelled);
}

// HiDream (flow matching): the step's estimate x_t - sigma v, and finish_now() decodes it.
TEST(DenoisedEstimate, HiDreamFinishNowDecodesTheFlowEstimate) {
  const auto golden = test::hidream_golden_dir();
  if (!std::filesystem::exists(golden + "/cases.json")) GTEST_SKIP() << "no golden set";
  auto folder = io::ModelFolder::open(verify::GoldenSet::load(golden).model_dir());
  pipeline::HiDreamPipeline pipe(folder, torch::kCPU, torch::kFloat32);
  pipeline::HiDreamTextToImage t;
  t.prompt = "a red fox";
  t.sampling.steps = 3;
  t.sampling.seed = 4;
  torch::Tensor at_stop;
  t.sampling.on_step = [&](const pipeline::HiDreamStep& st) -> StepAction {
    EXPECT_TRUE(st.denoised.defined());
    if (st.index == 0) return true;
    at_stop = st.denoised.to(torch::kCPU).clone();
    return StepAction::finish_now();
  };
  const auto r = pipe.text_to_image(t);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.steps_run, 2);
  ASSERT_TRUE(at_stop.defined());
  EXPECT_TRUE(r.latents.equal(at_stop));
  EXPECT_EQ(r.image.dim(), 4);
  t.sampling.on_step = [](const pipeline::HiDreamStep&) { return StepAction(false); };
  EXPECT_THROW(pipe.text_to_image(t), Cancelled);
}

}  // namespace test_denoised_estimate
}  // namespace diffuse
