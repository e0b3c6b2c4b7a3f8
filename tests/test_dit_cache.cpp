// DiT caches (accel/dit_cache.h) on a small random HiDream transformer: settings that skip
// nothing are bit-identical to no cache, skipped steps add exactly what was stored, TaylorSeer's
// forecasts are the finite-difference expansion, and bad specs are refused naming the flag.
#include <gtest/gtest.h>

#include <torch/torch.h>
#include <fstream>

#include "accel/dit_cache.h"
#include "hidream_test_util.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "models/hidream_transformer.h"
#include "pipeline/hidream_variant.h"
#include "test_util.h"

namespace diffuse {
namespace test_dit_cache {

using Method = DitCacheOptions::Method;

// 2 dual-stream blocks (0, 1) and 3 single-stream blocks (2..4).
constexpr int64_t kDual = 2, kSingle = 3;

struct Setup {
  models::HiDreamImageTransformer2DModel model{nullptr};
  torch::Tensor x, t5, llama, pooled;
};

Setup setup() {
  auto j = test::tiny_hidream_config();
  j["num_layers"] = kDual;
  j["num_single_layers"] = kSingle;
  j["llama_layers"] = {1, 0, 1, 0, 1};
  torch::manual_seed(3);
  Setup s;
  s.model = models::HiDreamImageTransformer2DModel(
      models::HiDreamTransformerConfig::from_json(io::JsonConfig(j, "transformer/config.json")));
  s.model->eval();
  s.x = torch::randn({2, 4, 8, 8});
  s.t5 = torch::randn({2, 7, 6});
  s.llama = torch::randn({2, 2, 5, 10});
  s.pooled = torch::randn({2, 5});
  return s;
}

// Denoiser calls of steps 0..n-1. Drifting: the latents and the timestep move every step, as
// in a generation; else every step sees the same inputs.
std::vector<torch::Tensor> run_steps(Setup& s, accel::DitCache* cache, int n, bool drift) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  for (int i = 0; i < n; ++i) {
    if (cache) cache->begin_step(i, n);
    models::HiDreamForwardOptions o;
    o.cache = cache;
    const auto x = drift ? s.x * (1.0 - 0.02 * i) : s.x;
    const auto t = torch::full({2}, drift ? 900.0 - 40.0 * i : 900.0);
    out.push_back(s.model->forward(x, t, s.t5, s.llama, s.pooled, o));
  }
  return out;
}

DitCacheOptions spec(const std::string& text, int warmup = 0) {
  auto o = accel::parse_dit_cache(text);
  o.warmup = warmup;
  return o;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(DitCache, ParsesSpecsAndRefusesBadOnesNamingTheFlag) {
  EXPECT_EQ(accel::parse_dit_cache("off").method, Method::kOff);
  const auto fb = accel::parse_dit_cache("fbcache:0.25");
  EXPECT_EQ(fb.method, Method::kFirstBlock);
  EXPECT_DOUBLE_EQ(fb.threshold, 0.25);
  EXPECT_DOUBLE_EQ(accel::parse_dit_cache("fbcache").threshold, DitCacheOptions().threshold);
  const auto ts = accel::parse_dit_cache("taylorseer:4:2");
  EXPECT_EQ(ts.method, Method::kTaylorSeer);
  EXPECT_EQ(ts.interval, 4);
  EXPECT_EQ(ts.order, 2);
  const auto dc = accel::parse_dit_cache("ditcache:2:3:3");
  EXPECT_EQ(dc.method, Method::kBlockSchedule);
  EXPECT_EQ(dc.first_block, 2);
  EXPECT_EQ(dc.last_block, 3);
  EXPECT_EQ(dc.interval, 3);
  EXPECT_EQ(accel::dit_cache_spec(dc), "ditcache:2:3:3");
  for (const char* bad : {"fbcache:-1", "fbcache:1.5", "fbcache:abc", "fbcache:nan",
                          "fbcache:0.1:2", "taylorseer:0", "taylorseer:3:3", "taylorseer:2.5",
                          "ditcache:2", "ditcache:3:2", "ditcache:-1:2", "teacache", ""}) {
    const auto msg = test::expect_throw<InvalidArgument>([&] { accel::parse_dit_cache(bad); });
    EXPECT_NE(msg.find(std::string("--cache ") + bad), std::string::npos) << msg;
  }
  const auto unet = test::expect_throw<InvalidArgument>(
      [] { accel::refuse_dit_cache_on_unet(accel::parse_dit_cache("fbcache")); });
  EXPECT_NE(unet.find("UNet"), std::string::npos) << unet;
  EXPECT_NE(unet.find("--deepcache"), std::string::npos) << unet;
  EXPECT_NO_THROW(accel::refuse_dit_cache_on_unet(accel::parse_dit_cache("off")));
}

TEST(DitCache, BlockRangesOutsideOneKindOfBlockAreRefused) {
  for (const char* bad : {"ditcache:1:2", "ditcache:3:5"}) {
    const auto msg = test::expect_throw<InvalidArgument>(
        [&] { accel::DitCache(accel::parse_dit_cache(bad), kDual, kSingle); });
    EXPECT_NE(msg.find("single-stream blocks 2..4"), std::string::npos) << msg;
  }
  // The default range: the middle half of the single-stream blocks.
  accel::DitCache middle(accel::parse_dit_cache("ditcache"), 16, 32);
  EXPECT_EQ(middle.options().first_block, 24);
  EXPECT_EQ(middle.options().last_block, 39);
}

TEST(DitCache, SettingsThatSkipNothingAreBitIdenticalToOff) {
  auto s = setup();
  const auto off = run_steps(s, nullptr, 5, true);
  for (const char* text : {"fbcache:0", "taylorseer:1:2", "ditcache:2:4:1", "ditcache:0:1:1"}) {
    accel::DitCache cache(spec(text), kDual, kSingle);
    const auto out = run_steps(s, &cache, 5, true);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(torch::equal(out[i], off[i])) << text << i;
    EXPECT_EQ(cache.cached_calls(), 0) << text;
    EXPECT_EQ(cache.full_calls(), 5) << text;
    EXPECT_EQ(cache.blocks_run(), cache.blocks_possible()) << text;
  }
}

TEST(DitCache, FirstBlockCacheAddsTheStoredResidualOfTheOtherBlocks) {
  auto s = setup();
  // The same inputs every step: the first block's residual does not change, so step 1 reuses
  // step 0's residual of blocks 1..4, and gives step 0's output up to rounding.
  accel::DitCache cache(spec("fbcache:0.05"), kDual, kSingle);
  const auto out = run_steps(s, &cache, 2, false);
  EXPECT_EQ(cache.cached_calls(), 1);
  EXPECT_EQ(cache.blocks_run(), kDual + kSingle + 1);
  EXPECT_LE(max_diff(out[1], out[0]), 1e-5 * out[0].abs().max().item<double>());
  // Within the warm-up nothing is reused.
  accel::DitCache warm(spec("fbcache:0.05", 2), kDual, kSingle);
  run_steps(s, &warm, 2, false);
  EXPECT_EQ(warm.cached_calls(), 0);
}

TEST(DitCache, BlockScheduleSkipsItsRangeOnTheStepsBetween) {
  auto s = setup();
  for (const auto& [text, range] :
       {std::pair<const char*, int64_t>{"ditcache:2:4:2", 3}, {"ditcache:0:1:2", 2}}) {
    accel::DitCache cache(spec(text), kDual, kSingle);
    const auto out = run_steps(s, &cache, 3, false);  // full, cached, full
    EXPECT_EQ(cache.cached_calls(), 1) << text;
    EXPECT_EQ(cache.blocks_run(), 3 * (kDual + kSingle) - range) << text;
    EXPECT_LE(max_diff(out[1], out[0]), 1e-5 * out[0].abs().max().item<double>()) << text;
    EXPECT_TRUE(torch::equal(out[2], out[0])) << text;  // a full step again
  }
}

TEST(DitCache, TaylorSeerOfOrderZeroReusesTheLastFullFeatures) {
  auto s = setup();
  accel::DitCache cache(spec("taylorseer:3:0"), kDual, kSingle);
  const auto out = run_steps(s, &cache, 3, false);  // step 0 full, 1 and 2 forecast
  EXPECT_EQ(cache.cached_calls(), 2);
  EXPECT_EQ(cache.blocks_run(), kDual + kSingle);
  // The same timestep and features: the final layer gives step 0's output exactly.
  EXPECT_TRUE(torch::equal(out[1], out[0]));
  EXPECT_TRUE(torch::equal(out[2], out[0]));
}

TEST(DitCache, TaylorSeerForecastsByFiniteDifferencesOfTheFullSteps) {
  const auto tokens = torch::zeros({1, 2, 3});
  auto full_step = [&](accel::DitCache& c, int step, double value) {
    c.begin_step(step, 10);
    c.begin_call(tokens);
    EXPECT_FALSE(c.forecasts()) << step;
    c.record_final(torch::full({1, 2, 3}, value), {});
  };
  auto forecast = [&](accel::DitCache& c, int step) {
    c.begin_step(step, 10);
    c.begin_call(tokens);
    EXPECT_TRUE(c.forecasts()) << step;
    return c.forecast().mean().item<double>();
  };
  // Order 1 on f(k) = k + 1, full steps 0 and 3: exact for a line.
  accel::DitCache linear(spec("taylorseer:3:1"), kDual, kSingle);
  full_step(linear, 0, 1.0);
  full_step(linear, 3, 4.0);
  EXPECT_NEAR(forecast(linear, 4), 5.0, 1e-6);
  EXPECT_NEAR(forecast(linear, 5), 6.0, 1e-6);
  // Order 2 on k^2, full steps 0, 3, 6: f(6) + f'(6) + f''/2 with backward differences.
  accel::DitCache square(spec("taylorseer:3:2"), kDual, kSingle);
  full_step(square, 0, 0.0);
  full_step(square, 3, 9.0);
  full_step(square, 6, 36.0);
  EXPECT_NEAR(forecast(square, 7), 36.0 + 9.0 + 2.0 / 2, 1e-5);
  // A call of another shape (E1's refine phase, another batch) starts afresh: it computes.
  square.begin_step(8, 10);
  square.begin_call(torch::zeros({2, 2, 3}));
  EXPECT_FALSE(square.forecasts());
}

// A bare method name takes the setting the model folder was measured with (issue 63, item 6);
// a spec with values, or a folder without defaults, is left as given.
TEST(DitCacheDefaults, ABareMethodTakesTheFoldersMeasuredSetting) {
  const auto demo = io::ModelFolder::open(std::string(DIFFUSE_SOURCE_DIR) + "/models/demo-edit");
  EXPECT_EQ(pipeline::dit_cache_spec(demo, "fbcache"), "fbcache:0.25");
  EXPECT_EQ(pipeline::dit_cache_spec(demo, "taylorseer"), "taylorseer:2:1");
  EXPECT_EQ(pipeline::dit_cache_spec(demo, "fbcache:0.1"), "fbcache:0.1");
  EXPECT_EQ(pipeline::dit_cache_spec(demo, "ditcache"), "ditcache");
  EXPECT_EQ(pipeline::dit_cache_spec(demo, "off"), "off");
  test::TempDir dir;
  const auto write = [&](const std::string& defaults) {
    std::ofstream(dir.file("model_index.json"))
        << R"({"_class_name": "HiDreamImagePipeline", "_diffuse_defaults": )" << defaults << "}";
    return io::ModelFolder::open(dir.path().string());
  };
  EXPECT_EQ(pipeline::dit_cache_spec(write(R"({"steps": 20})"), "fbcache"), "fbcache");
  for (const char* bad : {R"({"cache": {"fbcache": "taylorseer:2"}})",
                          R"({"cache": {"fbcache": "fbcache:-1"}})", R"({"cache": [1]})"}) {
    const auto folder = write(bad);
    EXPECT_THROW(pipeline::dit_cache_defaults(folder), Error) << bad;
  }
}

}  // namespace test_dit_cache
}  // namespace diffuse
