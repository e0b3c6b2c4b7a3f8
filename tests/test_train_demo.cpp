// `diffuse train-demo` at toy sizes: the modules train (gradients flow where fused kernels have
// no backward), a run writes a folder the normal pipeline loads, runs are deterministic, and
// refused or interrupted runs leave nothing behind.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <sstream>

#include "diffuse/pipeline.h"
#include "io/json_config.h"
#include "models/unet2d_condition.h"
#include "nn/attention.h"
#include "nn/fused_ops.h"
#include "test_util.h"
#include "train/demo_configs.h"
#include "train/demo_trainer.h"

namespace diffuse::train {
namespace test_train_demo {

namespace fs = std::filesystem;

TrainDemoOptions toy_options(const std::string& out) {
  TrainDemoOptions o;
  o.out = out;
  o.seed = 5;
  o.vae_steps = 2;
  o.unet_steps = 3;
  o.resolution = 32;
  o.vae_batch = 2;
  o.vae_crop = 16;
  o.unet_batch = 4;
  o.dataset_size = 8;
  return o;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Nothing named like the staging folder is left next to `out`.
void expect_no_staging_left(const fs::path& parent) {
  for (const auto& e : fs::directory_iterator(parent))
    EXPECT_EQ(e.path().filename().string().find(".partial-"), std::string::npos) << e.path();
}

TEST(TrainDemo, FlashAttentionStepsAsideForMathWhenGradientsAreRequired) {
  const auto saved = nn::default_attention_backend();
  nn::set_default_attention_backend(nn::AttentionBackend::kFlash);
  auto q = torch::randn({1, 2, 16, 8}, torch::requires_grad());
  auto k = torch::randn({1, 2, 16, 8});
  auto v = torch::randn({1, 2, 16, 8});
  auto out = nn::attention(q, k, v);
  ASSERT_TRUE(out.requires_grad());
  out.sum().backward();
  ASSERT_TRUE(q.grad().defined());
  EXPECT_TRUE(torch::isfinite(q.grad()).all().item<bool>());
  // Without gradients the flash kernel runs and agrees with math.
  {
    torch::NoGradGuard no_grad;
    auto flash = nn::attention(q, k, v);
    nn::AttentionOptions math;
    math.backend = nn::AttentionBackend::kMath;
    EXPECT_LT((flash - nn::attention(q, k, v, math)).abs().max().item<double>(), 1e-5);
  }
  nn::set_default_attention_backend(saved);
}

TEST(TrainDemo, Bf16NormsAreDifferentiable) {
  auto x = torch::randn({2, 8, 4, 4}).to(torch::kBFloat16).requires_grad_(true);
  auto w = torch::ones({8}, torch::requires_grad());
  auto b = torch::zeros({8}, torch::requires_grad());
  auto y = nn::group_norm(x, 4, w, b, 1e-5, /*silu=*/true);
  y.to(torch::kFloat32).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  ASSERT_TRUE(w.grad().defined());
  auto t = torch::randn({3, 16}).to(torch::kBFloat16).requires_grad_(true);
  nn::layer_norm(t, torch::Tensor(), torch::Tensor(), 1e-5).to(torch::kFloat32).sum().backward();
  EXPECT_TRUE(t.grad().defined());
}

TEST(TrainDemo, TheDemoUNetTrainsOnAFixedBatch) {
  torch::manual_seed(0);
  auto unet = models::UNet2DConditionModel(
      models::UNet2DConditionConfig::from_json(io::JsonConfig(demo_unet_config(8), "demo unet")));
  unet->train();
  torch::optim::Adam opt(unet->parameters(), torch::optim::AdamOptions(1e-3));
  auto x = torch::randn({2, 4, 8, 8}), target = torch::randn({2, 4, 8, 8});
  auto ctx = torch::randn({2, 5, 64});
  auto t = torch::tensor({10.0f, 500.0f});
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    auto loss = (unet->forward(x, t, ctx) - target).pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    (i == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first);
}

TEST(TrainDemo, WritesAFolderThatThePipelineLoadsAndIsDeterministic) {
  test::TempDir dir;
  const auto a = toy_options(dir.file("a")), b = toy_options(dir.file("b"));
  const auto report = train_demo(a);
  train_demo(b);
  EXPECT_EQ(report.vae_steps, 2);
  EXPECT_EQ(report.unet_steps, 3);
  EXPECT_GT(report.scaling_factor, 0);
  for (const char* f :
       {"model_index.json", "training.json", "scheduler/scheduler_config.json",
        "tokenizer/vocab.json", "text_encoder/model.safetensors",
        "unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors"})
    EXPECT_TRUE(fs::exists(fs::path(a.out) / f)) << f;
  EXPECT_EQ(read_bytes(fs::path(a.out) / "unet/diffusion_pytorch_model.safetensors"),
            read_bytes(fs::path(b.out) / "unet/diffusion_pytorch_model.safetensors"));
  EXPECT_EQ(read_bytes(fs::path(a.out) / "vae/diffusion_pytorch_model.safetensors"),
            read_bytes(fs::path(b.out) / "vae/diffusion_pytorch_model.safetensors"));
  expect_no_staging_left(dir.path());

  LoadOptions lo;
  lo.device = "cpu";
  lo.dtype = "fp32";
  lo.vae_dtype = "fp32";
  auto pipe = Text2Image::load(a.out, lo);
  EXPECT_EQ(pipe.info().default_width, 32);
  GenerationConfig cfg;
  cfg.prompts = {"a red circle on the left on a blue background"};
  cfg.steps = 2;
  cfg.seed = 1;
  auto out = pipe.generate(cfg);
  ASSERT_EQ(out.images.size(), 1u);
  EXPECT_EQ(out.images[0].width, 32);
}

TEST(TrainDemo, RefusesANonEmptyFolderUnlessForced) {
  test::TempDir dir;
  const auto out = dir.path() / "model";
  fs::create_directories(out);
  { std::ofstream(out / "keep.txt") << "mine"; }
  auto o = toy_options(out.string());
  const auto msg = test::expect_throw<InvalidArgument>([&] { train_demo(o); });
  EXPECT_NE(msg.find("--force"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(out / "keep.txt"));
  expect_no_staging_left(dir.path());

  { std::ofstream(dir.path() / "file") << "x"; }
  auto on_file = toy_options(dir.file("file"));
  on_file.force = true;
  EXPECT_THROW(train_demo(on_file), InvalidArgument);

  o.force = true;
  train_demo(o);
  EXPECT_FALSE(fs::exists(out / "keep.txt"));
  EXPECT_TRUE(fs::exists(out / "model_index.json"));
  expect_no_staging_left(dir.path());
}

TEST(TrainDemo, AnInterruptedRunLeavesNoFolder) {
  test::TempDir dir;
  std::atomic<bool> cancel{false};
  int calls = 0;
  auto o = toy_options(dir.file("model"));
  // Interrupt in the middle of the UNet stage.
  auto on_progress = [&](const TrainProgress& p) {
    ++calls;
    if (p.stage == "unet" && p.step == 1) cancel.store(true);
  };
  EXPECT_THROW(train_demo(o, on_progress, &cancel), Cancelled);
  EXPECT_GT(calls, 0);
  EXPECT_FALSE(fs::exists(dir.path() / "model"));
  expect_no_staging_left(dir.path());
}

TEST(TrainDemo, RejectsBadOptionsBeforeTraining) {
  test::TempDir dir;
  auto o = toy_options(dir.file("m"));
  o.resolution = 30;
  EXPECT_THROW(train_demo(o), InvalidArgument);
  o = toy_options(dir.file("m"));
  o.minutes = 0;
  EXPECT_THROW(train_demo(o), InvalidArgument);
  o = toy_options("");
  EXPECT_THROW(train_demo(o), InvalidArgument);
  EXPECT_FALSE(fs::exists(dir.path() / "m"));
}

}  // namespace test_train_demo
}  // namespace diffuse::train
