// The HiDream text stack against its golden set: every "tokenizer" and "text_encoder" case of
// the hidream-tiny set (or $DIFFUSE_HIDREAM_GOLDEN_DIR), run through the same code as
// `diffuse verify`; plus the attention bias the T5 and Llama encoders rely on.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "golden_case_check.h"
#include "io/json_config.h"
#include "models/llama.h"
#include "nn/attention.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_hidream_text {

const char* const kNoCases = "no_text_cases";

std::vector<std::string> text_case_names() {
  std::vector<std::string> names;
  try {
    for (const auto& c : verify::GoldenSet::load(test::hidream_golden_dir()).cases)
      if (c.component == "tokenizer" || c.component == "text_encoder") names.push_back(c.name);
  } catch (const std::exception&) {
    // Reported by the test itself (the set may be absent on this machine).
  }
  if (names.empty()) names.push_back(kNoCases);
  return names;
}

class HiDreamTextCaseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HiDreamTextCaseTest, MatchesReference) {
  const std::string dir = test::hidream_golden_dir();
  if (!std::filesystem::exists(dir + "/cases.json"))
    GTEST_SKIP() << "no golden set at " << dir << " (set DIFFUSE_HIDREAM_GOLDEN_DIR)";
  if (GetParam() == kNoCases) GTEST_SKIP() << dir << " has no tokenizer or text-encoder cases";
  auto set = verify::GoldenSet::load(dir);
  const auto* c = set.find(GetParam());
  ASSERT_NE(c, nullptr);
  test::expect_golden_case_passes(set, *c);
}

INSTANTIATE_TEST_SUITE_P(HiDreamTextGolden, HiDreamTextCaseTest,
                         ::testing::ValuesIn(text_case_names()), test::case_param_name);

// The additive bias (T5's position bias, padding masks) against a float64 reference, on every
// backend that takes it, with and without the causal mask.
TEST(AttentionBias, MatchesReferenceOnEveryBackendThatTakesIt) {
  torch::manual_seed(3);
  const int64_t B = 2, H = 3, N = 7, D = 8;
  auto q = torch::randn({B, H, N, D}), k = torch::randn({B, H, N, D}),
       v = torch::randn({B, H, N, D});
  auto bias = torch::randn({1, H, N, N});
  auto pad = torch::zeros({B, 1, 1, N});
  pad.index_put_({1, 0, 0, torch::indexing::Slice(4, N)}, std::numeric_limits<float>::lowest());
  for (bool causal : {false, true}) {
    auto full = (bias + pad).to(torch::kFloat64);
    auto scores =
        torch::matmul(q.to(torch::kFloat64), k.to(torch::kFloat64).transpose(-1, -2)) * 0.5 + full;
    if (causal)
      scores.masked_fill_(torch::ones({N, N}, torch::kBool).triu(1),
                          -std::numeric_limits<double>::infinity());
    auto expected = torch::matmul(scores.softmax(-1), v.to(torch::kFloat64));
    for (auto backend : nn::available_attention_backends(torch::kCPU)) {
      nn::AttentionOptions o;
      o.scale = 0.5;
      o.causal = causal;
      o.bias = bias + pad;
      o.backend = backend;
      if (backend == nn::AttentionBackend::kFlash) {
        // The flash kernels have no bias: an explicit request is refused, auto falls back.
        EXPECT_THROW(nn::attention(q, k, v, o), InvalidArgument);
        continue;
      }
      auto got = nn::attention(q, k, v, o).to(torch::kFloat64);
      EXPECT_LT((got - expected).abs().max().item<double>(), 1e-5)
          << nn::attention_backend_name(backend) << (causal ? " causal" : "");
    }
    nn::AttentionOptions o;
    o.scale = 0.5;
    o.causal = causal;
    o.bias = bias + pad;
    EXPECT_LT((nn::attention(q, k, v, o).to(torch::kFloat64) - expected).abs().max().item<double>(),
              1e-5);
  }
}

TEST(AttentionBias, RejectsBiasThatDoesNotBroadcast) {
  auto q = torch::randn({1, 2, 4, 8});
  nn::AttentionOptions o;
  o.bias = torch::zeros({1, 2, 4, 5});
  const auto msg = test::expect_throw<InvalidArgument>([&] { nn::attention(q, q, q, o); });
  EXPECT_NE(msg.find("broadcastable"), std::string::npos) << msg;
  o.bias = torch::zeros({4, 4}, torch::kInt64);
  EXPECT_THROW(nn::attention(q, q, q, o), InvalidArgument);
}

TEST(LlamaConfig, RejectsBadValuesNamingTheKey) {
  auto bad = [](nlohmann::json j, const std::string& key) {
    const auto msg = test::expect_throw<ConfigError>(
        [&] { models::LlamaConfig::from_json(io::JsonConfig(j, "text_encoder_4/config.json")); });
    EXPECT_NE(msg.find("text_encoder_4/config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
  };
  bad({{"hidden_size", 30}, {"num_attention_heads", 4}}, "num_attention_heads");
  bad({{"hidden_size", 32}, {"num_attention_heads", 4}, {"num_key_value_heads", 3}},
      "num_key_value_heads");
  bad({{"hidden_act", "gelu"}}, "hidden_act");
  bad({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 2.0}}}}, "rope_type");
  bad({{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}}, "low_freq_factor");
}

// Llama-3.1's rope_scaling: high frequencies kept, low ones divided by factor.
TEST(LlamaConfig, Llama3RopeScaling) {
  models::LlamaConfig c;
  c.head_dim = 128;
  auto plain = models::llama_inv_freq(c);
  c.rope_type = "llama3";
  auto scaled = models::llama_inv_freq(c);
  EXPECT_FLOAT_EQ(scaled[0].item<float>(), plain[0].item<float>());
  EXPECT_FLOAT_EQ(scaled[63].item<float>(), plain[63].item<float>() / 8);
}

}  // namespace test_hidream_text
}  // namespace diffuse
