// HiDreamImageTransformer2DModel, the Flux-style VAE and the I1/E1 pipelines: every
// "transformer", "vae" and "pipeline" case of the HiDream golden set (through the same code as
// `diffuse verify`), the MoE fast path against its dense definition, RoPE, attention backends and
// precisions against each other, and the config / input / weight errors a user can run into.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "diffuse/errors.h"
#include "golden_case_check.h"
#include "hidream_test_util.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "models/hidream_transformer.h"
#include "nn/attention.h"
#include "nn/moe_feed_forward.h"
#include "nn/rope.h"
#include "pipeline/hidream.h"
#include "cpu_bf16.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_hidream_transformer {

namespace fs = std::filesystem;
using test::hidream_golden_dir;

const char* const kNoCases = "no_cases";

bool have_hidream_set() {
  return fs::exists(hidream_golden_dir() + "/cases.json");
}

std::vector<std::string> case_names(std::initializer_list<const char*> components) {
  std::vector<std::string> names;
  try {
    for (const auto& c : verify::GoldenSet::load(hidream_golden_dir()).cases)
      for (const char* comp : components)
        if (c.component == comp) names.push_back(c.name);
  } catch (const std::exception&) {
    // Reported by the test itself (the set may be absent on this machine).
  }
  if (names.empty()) names.push_back(kNoCases);
  return names;
}

class HiDreamCoreCaseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HiDreamCoreCaseTest, MatchesReference) {
  if (!have_hidream_set())
    GTEST_SKIP() << "no golden set at " << hidream_golden_dir()
                 << " (set DIFFUSE_HIDREAM_GOLDEN_DIR)";
  if (GetParam() == kNoCases) GTEST_SKIP() << "the set has no transformer or vae cases";
  auto set = verify::GoldenSet::load(hidream_golden_dir());
  const auto* c = set.find(GetParam());
  ASSERT_NE(c, nullptr);
  test::expect_golden_case_passes(set, *c);
}

INSTANTIATE_TEST_SUITE_P(HiDreamGolden, HiDreamCoreCaseTest,
                         ::testing::ValuesIn(case_names({"transformer", "vae", "pipeline"})),
                         test::case_param_name);

nlohmann::json tiny_config() {
  return test::tiny_hidream_config();
}

models::HiDreamTransformerConfig parse(const nlohmann::json& j) {
  return models::HiDreamTransformerConfig::from_json(io::JsonConfig(j, "transformer/config.json"));
}

void expect_config_error(const nlohmann::json& j, std::initializer_list<std::string> parts) {
  const std::string msg = test::expect_throw<ConfigError>([&] { parse(j); });
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

TEST(HiDreamConfig, RejectsMoreActivatedThanRoutedExperts) {
  auto j = tiny_config();
  j["num_activated_experts"] = 4;
  expect_config_error(j, {"transformer/config.json", "num_activated_experts", "4", "3 routed"});
}

TEST(HiDreamConfig, RejectsRopeAxesThatDoNotCoverTheHead) {
  auto j = tiny_config();
  j["axes_dims_rope"] = {4, 2, 4};
  expect_config_error(j, {"axes_dims_rope", "[4, 2, 4]", "sums to 10", "attention_head_dim (8)"});
  j["axes_dims_rope"] = {2, 1, 1};
  expect_config_error(j, {"axes_dims_rope", "even"});
  j["axes_dims_rope"] = {2, 2};  // half the head: diffusers rotates the first half
  EXPECT_NO_THROW(parse(j));
}

TEST(HiDreamConfig, RejectsLlamaLayersNotOnePerBlock) {
  auto j = tiny_config();
  j["llama_layers"] = {0, 1};
  expect_config_error(j, {"llama_layers", "2 entries", "3"});
  j["llama_layers"] = {0, -1, 1};
  expect_config_error(j, {"llama_layers", "negative"});
  j.erase("patch_size");
  expect_config_error(j, {"patch_size"});
}

struct TinyInputs {
  torch::Tensor x, t, t5, llama, pooled;
};

TinyInputs tiny_inputs(int64_t B, int64_t H, int64_t W, uint64_t seed = 0) {
  torch::manual_seed(seed);
  return {torch::randn({B, 4, H, W}), torch::tensor({700.0f, 25.5f}).narrow(0, 0, B),
          torch::randn({B, 7, 6}), torch::randn({2, B, 5, 10}), torch::randn({B, 5})};
}

models::HiDreamImageTransformer2DModel tiny_model(const nlohmann::json& j = tiny_config()) {
  torch::manual_seed(1);
  models::HiDreamImageTransformer2DModel m(parse(j));
  m->eval();
  return m;
}

torch::Tensor run(models::HiDreamImageTransformer2DModel& m, const TinyInputs& in,
                  int64_t max_seq = 0) {
  torch::NoGradGuard no_grad;
  models::HiDreamForwardOptions o;
  o.max_seq = max_seq;
  return m->forward(in.x, in.t, in.t5, in.llama, in.pooled, o);
}

TEST(HiDreamTransformer, RejectsLatentsBeyondMaxResolution) {
  auto m = tiny_model();  // max_resolution 8x8, patch 2: 16 tokens
  EXPECT_EQ(run(m, tiny_inputs(1, 8, 8)).sizes(), torch::IntArrayRef({1, 4, 8, 8}));
  const std::string msg =
      test::expect_throw<InvalidArgument>([&] { run(m, tiny_inputs(1, 8, 10)); });
  for (const char* p : {"8x10 latent", "20 image tokens", "16", "max_resolution 8x8"})
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
  // E1 raises max_seq to its exact token count.
  EXPECT_EQ(run(m, tiny_inputs(1, 8, 10), 20).sizes(), torch::IntArrayRef({1, 4, 8, 10}));
}

TEST(HiDreamTransformer, RejectsMalformedInputs) {
  auto m = tiny_model();
  auto in = tiny_inputs(2, 4, 4);
  auto bad = in;
  bad.x = torch::randn({2, 4, 5, 4});
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] { run(m, bad); }).find("patch size 2"),
            std::string::npos);
  bad = in;
  bad.llama = torch::randn({1, 2, 5, 10});  // llama_layers needs index 1
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] { run(m, bad); }).find("layers >= 2"),
            std::string::npos);
  bad = in;
  bad.t5 = torch::randn({2, 7, 5});
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] { run(m, bad); }).find("T5"),
            std::string::npos);
  bad = in;
  bad.pooled = torch::randn({2, 6});
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] { run(m, bad); }).find("pooled"),
            std::string::npos);
}

TEST(HiDreamTransformer, PaddingOnlyAffectsNonSquareLatentsThroughTheKeyMask) {
  auto m = tiny_model();
  auto in = tiny_inputs(2, 4, 6);  // 6 tokens, padded to 16
  auto padded = run(m, in);
  auto exact = run(m, in, 6);  // no padding
  // Padded keys take softmax weight (logit 0), so the two differ, as in diffusers.
  EXPECT_GT((padded - exact).abs().max().item<double>(), 1e-4);
  EXPECT_TRUE(torch::isfinite(padded).all().item<bool>());
}

TEST(HiDreamTransformer, FlashAttentionMatchesMathOnPaddedAndE1Inputs) {
  auto m = tiny_model();
  for (auto [H, W, max_seq] : {std::tuple<int64_t, int64_t, int64_t>{4, 6, 0}, {4, 8, 8}}) {
    auto in = tiny_inputs(2, H, W);
    nn::set_default_attention_backend(nn::AttentionBackend::kMath);
    auto math = run(m, in, max_seq);
    nn::set_default_attention_backend(nn::AttentionBackend::kFlash);
    auto flash = run(m, in, max_seq);
    nn::set_default_attention_backend(nn::AttentionBackend::kAuto);
    const double err = (flash - math).abs().max().item<double>();
    std::cout << "  " << H << "x" << W << " flash vs math max abs err " << err << "\n";
    EXPECT_LT(err, 1e-5);
  }
}

TEST(HiDreamTransformer, Bf16StaysCloseToFloat32) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  auto m = tiny_model();
  auto in = tiny_inputs(2, 4, 6);
  auto ref = run(m, in);
  m->to(torch::kBFloat16);
  auto low = run(m, in).to(torch::kFloat32);
  const double rel = ((low - ref).norm() / ref.norm()).item<double>();
  std::cout << "  bf16 vs fp32 relative error " << rel << "\n";
  EXPECT_LT(rel, 0.05);
}

TEST(HiDreamTransformer, RopeRotatesAdjacentPairsByAxis) {
  // One token at (frame 0, row 2, col 3) with axes [4, 2, 2]: angles 0, 0 | 2 | 3.
  auto table = nn::rope_table(torch::tensor({{0.0f, 2.0f, 3.0f}}), {4, 2, 2}, 10000.0, torch::kCPU);
  ASSERT_EQ(table.cos.sizes(), torch::IntArrayRef({1, 4}));
  EXPECT_NEAR(table.cos[0][2].item<double>(), std::cos(2.0), 1e-7);
  EXPECT_NEAR(table.sin[0][3].item<double>(), std::sin(3.0), 1e-7);
  // x = [1, 0] pairs rotate to (cos, sin); a second token beyond the table is left alone.
  auto x = torch::zeros({1, 2, 1, 8});
  x.select(3, 4).fill_(1);  // pair 2, first element
  auto y = nn::apply_rope(x, table);
  EXPECT_NEAR(y[0][0][0][4].item<double>(), std::cos(2.0), 1e-6);
  EXPECT_NEAR(y[0][0][0][5].item<double>(), std::sin(2.0), 1e-6);
  EXPECT_TRUE(torch::equal(y.select(1, 1), x.select(1, 1)));
}

TEST(MoEFeedForward, GroupedExpertsMatchTheDenseDefinition) {
  torch::NoGradGuard no_grad;
  for (auto [experts, top_k] : {std::pair<int64_t, int64_t>{4, 2}, {5, 1}, {3, 3}, {8, 2}}) {
    torch::manual_seed(experts * 10 + top_k);
    nn::MOEFeedForwardSwiGLU moe(16, 64, experts, top_k);
    auto x = torch::randn({3, 37, 16});
    auto fast = moe->forward(x);
    auto dense = moe->forward_dense_reference(x);
    EXPECT_LT((fast - dense).abs().max().item<double>(), 1e-5)
        << experts << " experts, top-" << top_k;
  }
}

TEST(MoEFeedForward, TopKWeightsAreNotRenormalised) {
  torch::NoGradGuard no_grad;
  nn::MoEGate gate(8, 4, 2);
  auto routing = gate(torch::randn({10, 8}));
  auto sums = routing.weights.sum(1);
  EXPECT_TRUE((sums < 1.0 - 1e-4).all().item<bool>()) << sums;
  EXPECT_EQ(nn::swiglu_hidden_dim(4 * 32), 256);
  EXPECT_EQ(nn::swiglu_hidden_dim(4 * 2560), 6912);  // HiDream-I1's experts
}

TEST(HiDreamTransformer, MissingExpertWeightIsNamed) {
  if (!have_hidream_set()) GTEST_SKIP() << "no golden set at " << hidream_golden_dir();
  const fs::path src = fs::path(verify::GoldenSet::load(hidream_golden_dir()).model_dir());
  test::TempDir dir;
  fs::copy_file(src / "model_index.json", dir.path() / "model_index.json");
  fs::create_directories(dir.path() / "transformer");
  fs::copy_file(src / "transformer" / "config.json", dir.path() / "transformer" / "config.json");
  auto file = io::SafetensorsFile::open(
      (src / "transformer" / "diffusion_pytorch_model.safetensors").string());
  std::vector<std::pair<std::string, torch::Tensor>> kept;
  std::string dropped;
  for (const auto& name : file->names()) {
    if (dropped.empty() && name.find(".experts.1.w3.") != std::string::npos) {
      dropped = name;
      continue;
    }
    kept.emplace_back(name, file->get(name));
  }
  ASSERT_FALSE(dropped.empty());
  io::save_safetensors(
      (dir.path() / "transformer" / "diffusion_pytorch_model.safetensors").string(), kept);
  auto folder = io::ModelFolder::open(dir.path().string());
  const std::string msg = test::expect_throw<FormatError>(
      [&] { models::load_hidream_transformer(folder, torch::kCPU, torch::kFloat32); });
  EXPECT_NE(msg.find(dropped), std::string::npos) << msg;
  EXPECT_NE(msg.find("transformer"), std::string::npos) << msg;
}

}  // namespace test_hidream_transformer
}  // namespace diffuse

namespace diffuse {
namespace test_hidream_transformer {

TEST(HiDreamPipeline, EditRejectsBadImagesAndRefineStrengthAndResizesOthers) {
  if (!have_hidream_set()) GTEST_SKIP() << "no golden set at " << hidream_golden_dir();
  auto folder = io::ModelFolder::open(verify::GoldenSet::load(hidream_golden_dir()).model_dir());
  pipeline::HiDreamPipeline pipe(folder, torch::kCPU, torch::kFloat32);
  pipeline::HiDreamEdit e;
  e.prompt = "make it red";
  e.sampling.steps = 1;
  for (auto image : {torch::Tensor(), torch::zeros({1, 1, 3}, torch::kUInt8),
                     torch::zeros({64, 64}, torch::kUInt8), torch::zeros({64, 64, 3}),
                     torch::zeros({1, 1, 3}, torch::kUInt8).expand({9000, 8000, 3})}) {
    e.image = image;
    const std::string msg = test::expect_throw<InvalidArgument>([&] { pipe.edit(e); });
    EXPECT_NE(msg.find("source image"), std::string::npos) << msg;
  }
  // Any other size is scaled to the model's area with sides that are multiples of 16.
  e.image = torch::full({100, 300, 3}, 128, torch::kUInt8);
  auto resized = pipe.edit(e);
  EXPECT_EQ(resized.image.size(2) % 16, 0);
  EXPECT_EQ(resized.image.size(1) % 16, 0);
  EXPECT_LE(resized.image.size(1) * resized.image.size(2), 128 * 128);
  EXPECT_GT(resized.image.size(2), resized.image.size(1));
  e.image = torch::zeros({64, 64, 3}, torch::kUInt8);
  for (double refine : {-0.1, 1.5, std::nan("")}) {
    e.refine_strength = refine;
    const std::string msg = test::expect_throw<InvalidArgument>([&] { pipe.edit(e); });
    EXPECT_NE(msg.find("refine_strength"), std::string::npos) << msg;
  }
  EXPECT_EQ(pipe.normalized_size(160, 96, 128), std::make_pair(160, 96));
  EXPECT_THROW(pipe.normalized_size(0, 96, 128), InvalidArgument);
}

}  // namespace test_hidream_transformer
}  // namespace diffuse
