// Scheduler unit tests: construction and config errors, schedules, state handling, img2img
// usage and the numeric helpers. Exact agreement with diffusers is checked by the golden
// "scheduler" cases (test_golden.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "schedulers/numpy_ops.h"
#include "schedulers/quadrature.h"
#include "schedulers/scheduler.h"
#include "test_util.h"

namespace diffuse {
namespace test_schedulers {

using schedulers::make_scheduler;
using schedulers::Scheduler;
using schedulers::scheduler_names;
using schedulers::StepNoise;

io::JsonConfig pipeline_config() {
  return io::JsonConfig::load(test::golden_dir() + "/model/scheduler/scheduler_config.json");
}

io::JsonConfig with(const io::JsonConfig& base, const std::string& key, nlohmann::json value) {
  auto j = base.json();
  j[key] = std::move(value);
  return io::JsonConfig(j, "test_config.json");
}

// Expects `f` to throw E with every one of `parts` in its message.
template <typename E, typename F>
void expect_error(F f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// Runs every timestep of the schedule on random data; returns the final sample.
torch::Tensor run_all_steps(Scheduler& s, torch::Tensor sample, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  for (int64_t i = 0; i < s.timesteps().size(0); ++i) {
    auto t = s.timesteps()[i];
    auto x = s.scale_model_input(sample, t);
    auto model_output = torch::randn(sample.sizes(), gen, torch::kFloat32).to(sample.scalar_type());
    sample = s.step(model_output, t, sample, StepNoise::from_generator(gen)).prev_sample;
    EXPECT_EQ(x.sizes(), sample.sizes());
  }
  return sample;
}

TEST(Schedulers, NamesCoverAllDiffusersClasses) {
  auto names = scheduler_names();
  EXPECT_EQ(names.size(), 6u);
  for (const auto& name : names) {
    auto s = make_scheduler(name, pipeline_config());
    EXPECT_STRNE(s->class_name(), "");
    // Diffusers class names are accepted too.
    auto again = make_scheduler(s->class_name(), pipeline_config());
    EXPECT_STREQ(again->class_name(), s->class_name());
  }
}

TEST(Schedulers, BuildsFromClassNameInConfig) {
  auto s = make_scheduler(pipeline_config());
  EXPECT_STREQ(s->class_name(), pipeline_config().require<std::string>("_class_name").c_str());
}

TEST(Schedulers, UnknownClassIsConfigError) {
  auto cfg = with(pipeline_config(), "_class_name", "FancyScheduler");
  expect_error<ConfigError>([&] { make_scheduler(cfg); },
                            {"test_config.json", "_class_name", "FancyScheduler"});
  expect_error<InvalidArgument>([&] { make_scheduler("fancy", pipeline_config()); },
                                {"fancy", "euler_a"});
}

TEST(Schedulers, BadEnumValuesAreConfigErrors) {
  for (const auto& name : scheduler_names()) {
    SCOPED_TRACE(name);
    expect_error<ConfigError>(
        [&] { make_scheduler(name, with(pipeline_config(), "beta_schedule", "cubic")); },
        {"test_config.json", "beta_schedule", "cubic"});
    expect_error<ConfigError>(
        [&] { make_scheduler(name, with(pipeline_config(), "prediction_type", "flow")); },
        {"test_config.json", "prediction_type", "flow"});
    expect_error<ConfigError>(
        [&] { make_scheduler(name, with(pipeline_config(), "timestep_spacing", "random")); },
        {"timestep_spacing", "random"});
    expect_error<ConfigError>(
        [&] { make_scheduler(name, with(pipeline_config(), "beta_start", "small")); },
        {"beta_start"});
  }
  expect_error<ConfigError>(
      [&] {
        make_scheduler("DPMSolverMultistepScheduler", with(pipeline_config(), "solver_order", 5));
      },
      {"solver_order"});
  expect_error<ConfigError>(
      [&] { make_scheduler("euler", with(pipeline_config(), "interpolation_type", "cubic")); },
      {"interpolation_type"});
  expect_error<ConfigError>(
      [&] {
        make_scheduler("ddim",
                       with(pipeline_config(), "trained_betas", nlohmann::json::array({0.1, 0.2})));
      },
      {"trained_betas"});
}

TEST(Schedulers, StepCountOutOfRangeIsInvalidArgument) {
  for (const auto& name : scheduler_names()) {
    SCOPED_TRACE(name);
    auto s = make_scheduler(name, pipeline_config());
    EXPECT_THROW(s->set_timesteps(0), InvalidArgument);
    EXPECT_THROW(s->set_timesteps(-3), InvalidArgument);
    EXPECT_THROW(s->set_timesteps(static_cast<int>(s->num_train_timesteps()) + 1), InvalidArgument);
  }
}

TEST(Schedulers, StepBeforeSetTimestepsIsInvalidArgument) {
  auto s = make_scheduler("ddim", pipeline_config());
  auto x = torch::zeros({1, 4, 8, 8});
  EXPECT_THROW(s->step(x, torch::tensor(999), x), InvalidArgument);
}

TEST(Schedulers, EachRunsThreeStepsFromPipelineConfig) {
  for (const auto& name : scheduler_names()) {
    SCOPED_TRACE(name);
    auto s = make_scheduler(name, pipeline_config());
    s->set_timesteps(3);
    auto gen = at::detail::createCPUGenerator(7);
    auto sample = torch::randn({2, 4, 8, 8}, gen, torch::kFloat32) * s->init_noise_sigma();
    auto out = run_all_steps(*s, sample, 11);
    EXPECT_EQ(out.sizes(), sample.sizes());
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
    EXPECT_FALSE(torch::equal(out, sample));
  }
}

TEST(Schedulers, TimestepsDecrease) {
  for (const auto& name : scheduler_names()) {
    for (const char* spacing : {"linspace", "leading", "trailing"}) {
      for (int n : {1, 2, 5, 10, 25, 50}) {
        SCOPED_TRACE(name + " " + spacing + " " + std::to_string(n));
        auto s = make_scheduler(name, with(pipeline_config(), "timestep_spacing", spacing));
        s->set_timesteps(n);
        auto t = s->timesteps().to(torch::kFloat64);
        ASSERT_GE(t.size(0), 1);
        EXPECT_GE(t.min().item<double>(), 0.0);
        EXPECT_LT(t.max().item<double>(), static_cast<double>(s->num_train_timesteps()));
        auto diffs = t.slice(0, 1) - t.slice(0, 0, -1);
        if (name == "pndm") {
          // PLMS repeats one timestep (its first step needs two model evaluations).
          EXPECT_TRUE((diffs <= 0).all().item<bool>());
          EXPECT_EQ(std::get<0>(torch::_unique(t)).size(0), n);
        } else {
          EXPECT_TRUE((diffs < 0).all().item<bool>());
          EXPECT_EQ(t.size(0), n);
        }
        if (s->sigmas().defined()) {
          EXPECT_EQ(s->sigmas().size(0), t.size(0) + 1);
        }
      }
    }
  }
}

TEST(Schedulers, KnownSchedules) {
  // Stable Diffusion's PNDM (leading, steps_offset 1, skip_prk_steps) with 5 steps.
  auto pndm = make_scheduler("pndm", pipeline_config());
  pndm->set_timesteps(5);
  EXPECT_TRUE(
      torch::equal(pndm->timesteps(), torch::tensor({801, 601, 601, 401, 201, 1}, torch::kInt64)));
  auto ddim = make_scheduler("ddim", with(pipeline_config(), "timestep_spacing", "trailing"));
  ddim->set_timesteps(4);
  EXPECT_TRUE(torch::equal(ddim->timesteps(), torch::tensor({999, 749, 499, 249}, torch::kInt64)));
  auto euler = make_scheduler("euler", pipeline_config());
  euler->set_timesteps(4);
  EXPECT_TRUE(torch::equal(euler->timesteps(), torch::tensor({999.0f, 666.0f, 333.0f, 0.0f})));
  EXPECT_EQ(euler->sigmas()[-1].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(static_cast<float>(euler->init_noise_sigma()), euler->sigmas()[0].item<float>());
}

TEST(Schedulers, PndmRungeKuttaWarmup) {
  auto cfg = with(pipeline_config(), "skip_prk_steps", false);
  auto s = make_scheduler("pndm", cfg);
  EXPECT_THROW(s->set_timesteps(3), InvalidArgument);
  s->set_timesteps(10);
  EXPECT_EQ(s->timesteps().size(0), 12 + 10 - 3);
  auto out = run_all_steps(*s, torch::randn({1, 4, 8, 8}), 3);
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

TEST(Schedulers, SetTimestepsResetsState) {
  for (const auto& name : scheduler_names()) {
    SCOPED_TRACE(name);
    auto s = make_scheduler(name, pipeline_config());
    auto sample = torch::randn({1, 4, 8, 8}, at::detail::createCPUGenerator(1), torch::kFloat32);
    s->set_timesteps(6);
    auto first = run_all_steps(*s, sample, 5);
    s->set_timesteps(6);
    auto second = run_all_steps(*s, sample, 5);
    EXPECT_TRUE(torch::equal(first, second));
  }
}

TEST(Schedulers, AnyLatentShapeAndDtype) {
  for (const auto& name : scheduler_names()) {
    for (auto shape : {std::vector<int64_t>{1, 4, 16}, std::vector<int64_t>{2, 4, 3, 6, 5}}) {
      SCOPED_TRACE(name);
      auto s = make_scheduler(name, pipeline_config());
      s->set_timesteps(4);
      auto out = run_all_steps(*s, torch::randn(shape, torch::kFloat64), 9);
      EXPECT_EQ(out.sizes(), c10::IntArrayRef(shape));
      EXPECT_EQ(out.scalar_type(), torch::kFloat64);
      EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
    }
  }
}

TEST(Schedulers, AddNoiseShapeAndFormula) {
  for (const auto& name : scheduler_names()) {
    SCOPED_TRACE(name);
    auto s = make_scheduler(name, pipeline_config());
    s->set_timesteps(10);
    auto x = torch::randn({2, 4, 8, 8});
    auto noise = torch::randn({2, 4, 8, 8});
    auto t = s->timesteps().slice(0, 2, 3).repeat({2});
    auto noisy = s->add_noise(x, noise, t);
    EXPECT_EQ(noisy.sizes(), x.sizes());
    EXPECT_TRUE(torch::isfinite(noisy).all().item<bool>());
    EXPECT_FALSE(torch::allclose(noisy, x));
    EXPECT_THROW(s->add_noise(x, noise, t.repeat({3})), InvalidArgument);
  }
  auto ddim = make_scheduler("ddim", pipeline_config());
  ddim->set_timesteps(10);
  auto x = torch::randn({2, 3, 4});
  auto n = torch::randn({2, 3, 4});
  auto got = ddim->add_noise(x, n, torch::tensor({500, 10}));
  auto ac = ddim->alphas_cumprod();
  auto want0 = x[0] * ac[500].sqrt() + n[0] * (1 - ac[500]).sqrt();
  auto want1 = x[1] * ac[10].sqrt() + n[1] * (1 - ac[10]).sqrt();
  EXPECT_TRUE(torch::allclose(got[0], want0, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(got[1], want1, 1e-6, 1e-6));
}

TEST(Schedulers, Img2ImgBeginIndex) {
  // diffusers' img2img: timesteps[t_start * order:], set_begin_index(t_start * order), then
  // add_noise at the first remaining timestep.
  for (const char* name : {"euler", "euler_a", "lms", "dpmpp_2m"}) {
    SCOPED_TRACE(name);
    auto s = make_scheduler(name, pipeline_config());
    s->set_timesteps(5);
    const int64_t t_start = 2 * s->order();
    s->set_begin_index(t_start);
    auto x = torch::randn({1, 4, 8, 8});
    auto noise = torch::randn({1, 4, 8, 8});
    auto latent_t = s->timesteps().slice(0, t_start, t_start + 1);
    auto noisy = s->add_noise(x, noise, latent_t);
    const double sigma = s->sigmas()[t_start].item<double>();
    if (std::string(name) != "dpmpp_2m") {
      EXPECT_TRUE(torch::allclose(noisy, x + noise * sigma, 1e-5, 1e-6));
    }
    auto sample = noisy;
    for (int64_t i = t_start; i < s->timesteps().size(0); ++i) {
      auto t = s->timesteps()[i];
      s->scale_model_input(sample, t);
      sample = s->step(torch::randn({1, 4, 8, 8}), t, sample,
                       StepNoise::from_tensor(torch::randn({1, 4, 8, 8})))
                   .prev_sample;
      EXPECT_EQ(*s->step_index(), i + 1);
    }
    EXPECT_TRUE(torch::isfinite(sample).all().item<bool>());
  }
}

TEST(Schedulers, AncestralNoiseComesFromStepNoise) {
  auto s = make_scheduler("euler_a", pipeline_config());
  auto sample = torch::randn({1, 4, 8, 8}, at::detail::createCPUGenerator(3), torch::kFloat32);
  s->set_timesteps(4);
  auto a = run_all_steps(*s, sample, 21);
  s->set_timesteps(4);
  auto b = run_all_steps(*s, sample, 21);
  s->set_timesteps(4);
  auto c = run_all_steps(*s, sample, 22);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::allclose(a, c));
  s->set_timesteps(4);
  auto t = s->timesteps()[0];
  EXPECT_THROW(s->step(sample, t, sample, StepNoise::from_tensor(torch::zeros({2, 2}))),
               InvalidArgument);
}

TEST(Schedulers, DdimEtaAddsSuppliedNoise) {
  auto s = make_scheduler("ddim", pipeline_config());
  s->set_timesteps(5);
  auto x = torch::randn({1, 4, 8, 8});
  auto eps = torch::randn({1, 4, 8, 8});
  auto t = s->timesteps()[1];
  auto deterministic = s->step(eps, t, x).prev_sample;
  s->set_eta(1.0);
  auto zero_noise =
      s->step(eps, t, x, StepNoise::from_tensor(torch::zeros({1, 4, 8, 8}))).prev_sample;
  auto noisy = s->step(eps, t, x, StepNoise::from_tensor(torch::ones({1, 4, 8, 8}))).prev_sample;
  EXPECT_FALSE(torch::allclose(deterministic, zero_noise));
  // The noise enters linearly with a positive per-step standard deviation.
  auto diff = noisy - zero_noise;
  EXPECT_GT(diff.min().item<float>(), 0.0f);
  EXPECT_TRUE(torch::allclose(diff, torch::full_like(diff, diff.mean().item<float>()), 1e-5, 1e-4));
}

TEST(Schedulers, DdimClipsOrThresholdsPredictedSample) {
  auto x = torch::randn({2, 4, 8, 8}) * 5;
  auto eps = torch::randn({2, 4, 8, 8}) * 5;
  auto clip = make_scheduler(
      "ddim", with(with(pipeline_config(), "clip_sample", true), "clip_sample_range", 0.5));
  clip->set_timesteps(5);
  auto out = clip->step(eps, clip->timesteps()[0], x);
  EXPECT_LE(out.pred_original_sample.abs().max().item<float>(), 0.5f);
  auto thr = make_scheduler(
      "ddim", with(with(pipeline_config(), "thresholding", true), "sample_max_value", 2.0));
  thr->set_timesteps(5);
  out = thr->step(eps, thr->timesteps()[0], x);
  EXPECT_LE(out.pred_original_sample.abs().max().item<float>(), 1.0f + 1e-6f);
  auto free = make_scheduler("ddim", pipeline_config());
  free->set_timesteps(5);
  EXPECT_GT(free->step(eps, free->timesteps()[0], x).pred_original_sample.abs().max().item<float>(),
            2.0f);
}

TEST(Schedulers, FromConfigUsesTargetDefaults) {
  // Keys listed in _use_default_values take the new class's default (Euler: linspace).
  auto j = pipeline_config().json();
  j["timestep_spacing"] = "leading";
  j["_use_default_values"] = {"timestep_spacing"};
  auto euler = make_scheduler("euler", io::JsonConfig(j, "cfg.json"));
  euler->set_timesteps(4);
  EXPECT_EQ(euler->timesteps()[0].item<float>(), 999.0f);
  // dpmpp_2m always means DPM-Solver++ order 2, whatever the base config says.
  auto base = with(with(pipeline_config(), "algorithm_type", "sde-dpmsolver++"), "solver_order", 3);
  auto dpm = make_scheduler("dpmpp_2m", base);
  dpm->set_timesteps(5);
  auto x = torch::randn({1, 4, 8, 8});
  auto out0 = dpm->step(x, dpm->timesteps()[0], x).prev_sample;  // deterministic: no noise needed
  dpm->set_timesteps(5);
  auto out1 = dpm->step(x, dpm->timesteps()[0], x).prev_sample;
  EXPECT_TRUE(torch::equal(out0, out1));
}

TEST(Schedulers, KarrasAndVariantsBuildValidSchedules) {
  struct Variant {
    const char* name;
    const char* key;
    nlohmann::json value;
  };
  for (const auto& v : std::vector<Variant>{{"euler", "use_karras_sigmas", true},
                                            {"lms", "use_karras_sigmas", true},
                                            {"dpmpp_2m", "use_karras_sigmas", true},
                                            {"dpmpp_2m", "use_lu_lambdas", true},
                                            {"dpmpp_2m", "solver_type", "heun"},
                                            {"euler", "interpolation_type", "log_linear"},
                                            {"euler", "final_sigmas_type", "sigma_min"},
                                            {"ddim", "beta_schedule", "squaredcos_cap_v2"},
                                            {"ddim", "rescale_betas_zero_snr", true},
                                            {"euler", "rescale_betas_zero_snr", true}}) {
    SCOPED_TRACE(std::string(v.name) + " " + v.key);
    auto s = make_scheduler(v.name, with(pipeline_config(), v.key, v.value));
    s->set_timesteps(8);
    auto out = run_all_steps(*s, torch::randn({1, 4, 8, 8}) * s->init_noise_sigma(), 2);
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
    if (s->sigmas().defined()) {
      EXPECT_TRUE(torch::isfinite(s->sigmas()).all().item<bool>());
    }
  }
}

TEST(NumpyOps, LinspaceArangeRound) {
  using namespace schedulers::np;
  EXPECT_EQ(linspace(0, 999, 4), (std::vector<double>{0, 333, 666, 999}));
  EXPECT_EQ(linspace(3, 7, 1), (std::vector<double>{3}));
  // numpy's documented quirk: arange(1, 1.3, 0.1) has 4 elements (ceil of 3.0000000000000004).
  EXPECT_EQ(arange(1, 1.3, 0.1).size(), 4u);
  EXPECT_EQ(arange(1000, 0, -250).size(), 4u);
  EXPECT_TRUE(arange(0, 5, -1).empty());
  EXPECT_EQ(round(0.5), 0.0);
  EXPECT_EQ(round(1.5), 2.0);
  EXPECT_EQ(round(2.5), 2.0);
  EXPECT_EQ(round(-0.5), -0.0);
  auto y = interp_on_index_grid({-1, 0, 0.25, 1, 2.5, 9}, {10, 20, 40});
  EXPECT_EQ(y, (std::vector<double>{10, 10, 12.5, 20, 40, 40}));
}

TEST(Quadrature, ExactForPolynomialsAndAccurateForSmoothFunctions) {
  using schedulers::integrate;
  EXPECT_NEAR(integrate([](double x) { return 3 * x * x - 2 * x + 1; }, 0, 2), 8 - 4 + 2, 1e-13);
  EXPECT_NEAR(integrate([](double x) { return x * x * x; }, 2, 0), -4, 1e-13);
  EXPECT_NEAR(integrate([](double x) { return std::exp(x); }, 0, 3), std::exp(3) - 1, 1e-11);
  EXPECT_NEAR(integrate([](double x) { return std::sin(x); }, 0, 20), 1 - std::cos(20.0), 1e-10);
  EXPECT_NEAR(integrate([](double x) { return 1 / (1 + 25 * x * x); }, -1, 1),
              2 * std::atan(5.0) / 5, 1e-10);
}

}  // namespace test_schedulers
}  // namespace diffuse
