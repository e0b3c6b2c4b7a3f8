// Flow-matching schedulers (FlowMatchEulerDiscrete, FlowMatchLCM, HiDream's FlashFlowMatchEuler,
// UniPC in flow mode): the golden "scheduler" cases of the HiDream set whose class is one of
// them (run through the same code as `diffuse verify`), plus unit tests of the shift formulas,
// the step rules and config errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "diffuse/errors.h"
#include "golden_case_check.h"
#include "io/json_config.h"
#include "schedulers/flow_match.h"
#include "schedulers/scheduler.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_flow_schedulers {

using schedulers::make_scheduler;
using schedulers::Scheduler;
using schedulers::StepNoise;
using test::hidream_golden_dir;

// The diffusers class names behind the flow-matching short names.
std::set<std::string> flow_classes() {
  std::set<std::string> out;
  for (const auto& name : schedulers::flow_scheduler_names())
    out.insert(
        make_scheduler(name, io::JsonConfig(nlohmann::json::object(), "none"))->class_name());
  return out;
}

std::string case_class(const verify::GoldenCase& c) {
  std::string cls = c.params.value("class", std::string());
  if (cls.empty() && c.params.contains("config") && c.params["config"].is_object())
    cls = c.params["config"].value("_class_name", std::string());
  return cls;
}

const char* const kNoCases = "no_flow_scheduler_cases";

std::vector<std::string> flow_case_names() {
  std::vector<std::string> names;
  try {
    const auto classes = flow_classes();
    for (const auto& c : verify::GoldenSet::load(hidream_golden_dir()).cases)
      if (c.component == "scheduler" && classes.count(case_class(c))) names.push_back(c.name);
  } catch (const std::exception&) {
    // Reported by the test itself (the set may be absent on this machine).
  }
  if (names.empty()) names.push_back(kNoCases);
  return names;
}

class FlowSchedulerCaseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FlowSchedulerCaseTest, MatchesReference) {
  const std::string dir = hidream_golden_dir();
  if (!std::filesystem::exists(dir + "/cases.json"))
    GTEST_SKIP() << "no golden set at " << dir << " (set DIFFUSE_HIDREAM_GOLDEN_DIR)";
  if (GetParam() == kNoCases) GTEST_SKIP() << dir << " has no flow-matching scheduler cases";
  auto set = verify::GoldenSet::load(dir);
  const auto* c = set.find(GetParam());
  ASSERT_NE(c, nullptr);
  test::expect_golden_case_passes(set, *c);
}

INSTANTIATE_TEST_SUITE_P(FlowSchedulerGolden, FlowSchedulerCaseTest,
                         ::testing::ValuesIn(flow_case_names()), test::case_param_name);

io::JsonConfig config(const std::string& cls, nlohmann::json extra = nlohmann::json::object()) {
  extra["_class_name"] = cls;
  return io::JsonConfig(extra, "flow_config.json");
}

// Expects ConfigError with every one of `parts` in its message.
void expect_config_error(const io::JsonConfig& cfg, std::initializer_list<std::string> parts) {
  const std::string msg = test::expect_throw<ConfigError>([&] { make_scheduler(cfg); });
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

std::vector<float> floats(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

const char* const kClasses[] = {"FlowMatchEulerDiscreteScheduler", "FlowMatchLCMScheduler",
                                "FlashFlowMatchEulerDiscreteScheduler"};

TEST(FlowScheduler, CalculateShiftIsThePipelineFormula) {
  // HiDream's transformer.max_seq = 64 with the default config values.
  EXPECT_EQ(schedulers::calculate_shift(64), 0.46749999999999997);
  EXPECT_NEAR(schedulers::calculate_shift(256), 0.5, 1e-15);
  EXPECT_NEAR(schedulers::calculate_shift(4096), 1.15, 1e-12);
  auto s = make_scheduler(config("FlowMatchEulerDiscreteScheduler", {{"base_shift", 0.0},
                                                                     {"max_shift", 1.0},
                                                                     {"base_image_seq_len", 0},
                                                                     {"max_image_seq_len", 100}}));
  auto* flow = dynamic_cast<schedulers::FlowMatchScheduler*>(s.get());
  ASSERT_NE(flow, nullptr);
  EXPECT_NEAR(flow->shift_mu_for(25), 0.25, 1e-15);
}

TEST(FlowScheduler, TimeShiftFormulas) {
  using schedulers::TimeShiftType;
  for (double sigma : {0.001, 0.3, 0.75, 1.0}) {
    EXPECT_NEAR(schedulers::time_shift(TimeShiftType::kExponential, 0.0, sigma), sigma, 1e-15);
    EXPECT_NEAR(schedulers::time_shift(TimeShiftType::kLinear, 1.0, sigma), sigma, 1e-15);
    // e^mu plays the role of the static shift.
    EXPECT_NEAR(schedulers::time_shift(TimeShiftType::kExponential, std::log(3.0), sigma),
                3 * sigma / (1 + 2 * sigma), 1e-14);
  }
}

// Both schedules space sigmas evenly from 1 to the last training sigma (1/1000, statically
// shifted without dynamic shifting) and then shift each one.
TEST(FlowScheduler, StaticAndDynamicShiftSchedules) {
  const int n = 10;
  const double mu = 0.8, smin_static = 3 * 0.001 / (1 + 2 * 0.001);
  for (const char* cls : kClasses) {
    SCOPED_TRACE(cls);
    auto fixed = make_scheduler(config(cls, {{"shift", 3.0}}));
    auto dynamic = make_scheduler(config(cls, {{"use_dynamic_shifting", true}}));
    EXPECT_THROW(dynamic->set_timesteps(n), InvalidArgument);
    dynamic->set_shift_mu(mu);
    dynamic->set_timesteps(n);
    fixed->set_shift_mu(5.0);  // ignored without dynamic shifting
    fixed->set_timesteps(n);
    for (int i = 0; i < n; ++i) {
      const double lin_dynamic = 1 + i * (0.001 - 1) / (n - 1);
      const double lin_static = 1 + i * (smin_static - 1) / (n - 1);
      EXPECT_NEAR(dynamic->sigmas()[i].item<float>(),
                  std::exp(mu) / (std::exp(mu) + 1 / lin_dynamic - 1), 1e-6);
      EXPECT_NEAR(fixed->sigmas()[i].item<float>(), 3 * lin_static / (1 + 2 * lin_static), 1e-6);
    }
    fixed->set_shift_mu(std::nullopt);
    auto again = fixed->sigmas().clone();
    fixed->set_timesteps(10);
    EXPECT_TRUE(torch::equal(again, fixed->sigmas()));
  }
}

TEST(FlowScheduler, ScheduleShape) {
  for (const char* cls : kClasses) {
    SCOPED_TRACE(cls);
    auto s = make_scheduler(config(cls, {{"shift", 6.0}}));
    s->set_timesteps(7);
    ASSERT_EQ(s->timesteps().size(0), 7);
    ASSERT_EQ(s->sigmas().size(0), 8);
    EXPECT_FALSE(s->alphas_cumprod().defined());
    EXPECT_EQ(s->init_noise_sigma(), 1.0);
    auto sig = floats(s->sigmas());
    auto ts = floats(s->timesteps());
    EXPECT_EQ(sig.front(), 1.0f);
    EXPECT_EQ(sig.back(), 0.0f);
    for (size_t i = 0; i < ts.size(); ++i) {
      EXPECT_EQ(ts[i], sig[i] * 1000.0f);
      EXPECT_GT(sig[i], sig[i + 1]);
    }
  }
}

TEST(FlowScheduler, ShiftTerminalAndSigmaConversions) {
  auto s = make_scheduler(
      config("FlowMatchEulerDiscreteScheduler", {{"shift", 3.0}, {"shift_terminal", 0.1}}));
  s->set_timesteps(12);
  EXPECT_NEAR(s->sigmas()[-2].item<float>(), 0.1f, 1e-6);
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas"}) {
    SCOPED_TRACE(key);
    auto k =
        make_scheduler(config("FlowMatchEulerDiscreteScheduler", {{"shift", 3.0}, {key, true}}));
    k->set_timesteps(9);
    auto sig = floats(k->sigmas());
    EXPECT_NEAR(sig.front(), 1.0f, 1e-6);
    for (size_t i = 0; i + 1 < sig.size(); ++i) EXPECT_GT(sig[i], sig[i + 1]);
  }
}

TEST(FlowScheduler, EulerFollowsAConstantVelocityToTheData) {
  auto s = make_scheduler(config("FlowMatchEulerDiscreteScheduler", {{"shift", 3.0}}));
  s->set_timesteps(6);
  EXPECT_FALSE(s->is_stochastic());
  auto x0 = torch::randn({2, 4, 3, 5});
  auto noise = torch::randn({2, 4, 3, 5});
  auto x = noise.clone();  // sigma_0 = 1
  for (int64_t i = 0; i < s->timesteps().size(0); ++i) {
    auto out = s->step(noise - x0, s->timesteps()[i], x);
    EXPECT_TRUE(torch::allclose(out.pred_original_sample, x0, 1e-5, 1e-5));
    x = out.prev_sample;
  }
  EXPECT_TRUE(torch::allclose(x, x0, 1e-5, 1e-5));
}

TEST(FlowScheduler, LcmRenoisesEveryStepAndEndsOnX0) {
  auto s = make_scheduler(config("FlowMatchLCMScheduler", {{"shift", 3.0}}));
  s->set_timesteps(3);
  EXPECT_TRUE(s->is_stochastic());
  auto x = torch::randn({1, 4, 2, 2}), v = torch::randn({1, 4, 2, 2});
  auto zeros = torch::zeros_like(x);
  const float sigma0 = s->sigmas()[0].item<float>(), sigma1 = s->sigmas()[1].item<float>();
  auto out = s->step(v, s->timesteps()[0], x, StepNoise::from_tensor(zeros));
  EXPECT_TRUE(torch::allclose(out.pred_original_sample, x - v * sigma0));
  EXPECT_TRUE(torch::allclose(out.prev_sample, (x - v * sigma0) * (1 - sigma1)));
  s->step(v, s->timesteps()[1], out.prev_sample, StepNoise::from_tensor(zeros));
  // Last step: sigma_next = 0, so the (still drawn) noise has no weight.
  auto last = s->step(v, s->timesteps()[2], x, StepNoise::from_tensor(torch::randn_like(x)));
  EXPECT_TRUE(torch::equal(last.prev_sample, last.pred_original_sample));
  s->set_timesteps(3);
  EXPECT_THROW(s->step(v, s->timesteps()[0], x, StepNoise::from_tensor(torch::zeros({3}))),
               InvalidArgument);
}

TEST(FlowScheduler, FlashLastStepKeepsTheSample) {
  auto s = make_scheduler(config("FlashFlowMatchEulerDiscreteScheduler", {{"shift", 6.0}}));
  s->set_timesteps(2);
  EXPECT_TRUE(s->is_stochastic());
  auto x = torch::randn({1, 4, 2, 2}), v = torch::randn({1, 4, 2, 2});
  const float sigma1 = s->sigmas()[1].item<float>();
  auto first = s->step(v, s->timesteps()[0], x, StepNoise::from_tensor(torch::ones_like(x)));
  EXPECT_TRUE(torch::allclose(first.prev_sample, (x - v) * (1 - sigma1) + sigma1));
  // No noise is needed (or drawn) on the last step, and the input comes back unchanged.
  auto last = s->step(v, s->timesteps()[1], first.prev_sample);
  EXPECT_TRUE(torch::equal(last.prev_sample, first.prev_sample));
  EXPECT_TRUE(torch::allclose(last.pred_original_sample, first.prev_sample - v * sigma1));
}

TEST(FlowScheduler, AddNoiseInterpolates) {
  auto s = make_scheduler(config("FlowMatchEulerDiscreteScheduler", {{"shift", 3.0}}));
  s->set_timesteps(5);
  s->set_begin_index(2);
  auto x = torch::randn({2, 4, 2, 2}), n = torch::randn({2, 4, 2, 2});
  const float sigma = s->sigmas()[2].item<float>();
  auto noised = s->add_noise(x, n, s->timesteps().slice(0, 2, 3).repeat({2}));
  EXPECT_TRUE(torch::allclose(noised, n * sigma + x * (1 - sigma)));
}

TEST(FlowScheduler, FactoryNames) {
  const auto ddpm = schedulers::scheduler_names();
  for (const auto& name : schedulers::flow_scheduler_names()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(std::find(ddpm.begin(), ddpm.end(), name), ddpm.end());
    auto s = make_scheduler(name, config("EulerDiscreteScheduler"));
    // The flow-mode keys are what UniPC needs; the other classes ignore them.
    auto again = make_scheduler(config(
        s->class_name(), {{"use_flow_sigmas", true}, {"prediction_type", "flow_prediction"}}));
    EXPECT_STREQ(again->class_name(), s->class_name());
  }
  EXPECT_GE(schedulers::flow_scheduler_names().size(), 3u);
  // Only UniPC's flow mode exists: a Stable Diffusion style UniPC config is refused.
  expect_config_error(config("UniPCMultistepScheduler", {{"prediction_type", "flow_prediction"}}),
                      {"flow_config.json", "use_flow_sigmas"});
  expect_config_error(config("UniPCMultistepScheduler", {{"use_flow_sigmas", true},
                                                         {"prediction_type", "flow_prediction"},
                                                         {"flow_shift", 1e308}}),
                      {"flow_config.json", "flow_shift", "1000"});
}

// With exact flow data (x = (1 - sigma) x0 + sigma noise, v = noise - x0) every deterministic
// scheduler predicts x0 at each step and ends on it.
TEST(FlowScheduler, DeterministicSchedulersReachTheData) {
  for (const auto& name : schedulers::flow_scheduler_names()) {
    auto s = make_scheduler(name, config("FlowMatchEulerDiscreteScheduler", {{"shift", 3.0}}));
    if (s->is_stochastic()) continue;
    SCOPED_TRACE(name);
    s->set_timesteps(6);
    auto x0 = torch::randn({2, 4, 3, 5});
    auto noise = torch::randn({2, 4, 3, 5});
    const float sigma0 = s->sigmas()[0].item<float>();
    auto x = noise * sigma0 + x0 * (1 - sigma0);
    for (int64_t i = 0; i < s->timesteps().size(0); ++i) {
      auto out = s->step(noise - x0, s->timesteps()[i], x);
      EXPECT_TRUE(torch::allclose(out.pred_original_sample, x0, 1e-4, 1e-4));
      x = out.prev_sample;
    }
    EXPECT_TRUE(torch::allclose(x, x0, 1e-4, 1e-4));
  }
}

TEST(FlowScheduler, BadConfigValuesAreConfigErrors) {
  for (const char* cls : kClasses) {
    SCOPED_TRACE(cls);
    expect_config_error(config(cls, {{"shift", 0.0}}), {"flow_config.json", "shift", "0"});
    expect_config_error(config(cls, {{"shift", "big"}}), {"flow_config.json", "shift"});
    // Finite but past what float32 sigmas can take (NaN timesteps mid-run otherwise).
    expect_config_error(config(cls, {{"shift", 1e308}}), {"flow_config.json", "shift", "1000"});
    expect_config_error(config(cls, {{"num_train_timesteps", 0}}), {"num_train_timesteps"});
    expect_config_error(
        config(cls, {{"use_karras_sigmas", true}, {"use_exponential_sigmas", true}}),
        {"use_karras_sigmas"});
    expect_config_error(config(cls, {{"use_beta_sigmas", true}}), {"use_beta_sigmas"});
    expect_config_error(config(cls, {{"invert_sigmas", true}}), {"invert_sigmas"});
  }
  const char* euler = "FlowMatchEulerDiscreteScheduler";
  expect_config_error(config(euler, {{"time_shift_type", "cubic"}}), {"time_shift_type", "cubic"});
  expect_config_error(config(euler, {{"shift_terminal", 1.5}}), {"shift_terminal", "1.5"});
  expect_config_error(config("FlowMatchLCMScheduler", {{"scale_factors", {1.5, 2.0}}}),
                      {"scale_factors"});
  // hi_diffusers' flash scheduler does not know these keys: ignored, as from_config does.
  make_scheduler(config("FlashFlowMatchEulerDiscreteScheduler", {{"time_shift_type", "cubic"}}));
}

}  // namespace test_flow_schedulers
}  // namespace diffuse
