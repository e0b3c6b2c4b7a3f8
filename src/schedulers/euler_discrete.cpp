#include "schedulers/euler_discrete.h"

#include <torch/torch.h>

#include <cmath>

namespace diffuse::schedulers {

namespace {

SigmaScheduleOptions euler_options(const SchedulerConfig& config) {
  SigmaScheduleOptions o;
  o.spacing = config.timestep_spacing("linspace");
  o.steps_offset = config.steps_offset();
  o.log_linear =
      config.choice("interpolation_type", "linear", {"linear", "log_linear"}) == "log_linear";
  o.karras = config.flag("use_karras_sigmas", false);
  o.sigma_min = config.optional_number("sigma_min");
  o.sigma_max = config.optional_number("sigma_max");
  o.final_sigma_min =
      config.choice("final_sigmas_type", "zero", {"zero", "sigma_min"}) == "sigma_min";
  return o;
}

}  // namespace

EulerDiscreteScheduler::EulerDiscreteScheduler(const SchedulerConfig& config)
    : SigmaScheduler(config, sigma_alphas_cumprod(config), config.timestep_spacing("linspace")),
      prediction_type_(
          config.prediction_type({"epsilon", "v_prediction", "sample", "original_sample"})),
      options_(euler_options(config)),
      continuous_timesteps_(
          config.choice("timestep_type", "discrete", {"discrete", "continuous"}) == "continuous" &&
          prediction_type_ == PredictionType::kVPrediction) {}

void EulerDiscreteScheduler::set_timesteps(int n) {
  check_num_inference_steps(n);
  auto schedule = make_sigma_schedule(alphas_cumprod_, n, options_);
  if (continuous_timesteps_) {
    // diffusers: 0.25 * log(sigma) in float32 for all but the final sigma.
    schedule.timesteps.clear();
    for (size_t i = 0; i + 1 < schedule.sigmas.size(); ++i)
      schedule.timesteps.push_back(0.25f * std::log(schedule.sigmas[i]));
  }
  install(schedule, n);
}

StepOutput EulerDiscreteScheduler::step(const torch::Tensor& model_output,
                                        const torch::Tensor& timestep,
                                        const torch::Tensor& sample_in, const StepNoise& noise) {
  require_timesteps("step");
  init_step_index(timestep);
  const int64_t i = *step_index_;
  const float sigma = sigma_at(i);
  const float sigma_next = sigma_at(i + 1);
  // No churn (s_churn = 0, as the pipelines call it): sigma_hat = sigma.
  const float sigma_hat = sigma;
  auto sample = sample_in.to(torch::kFloat32);
  auto pred_original = predict_original_sample(prediction_type_, sample, model_output, sigma_hat);
  auto derivative = (sample - pred_original) / static_cast<double>(sigma_hat);
  const float dt = sigma_next - sigma_hat;
  auto prev = (sample + derivative * static_cast<double>(dt)).to(model_output.scalar_type());
  step_index_ = i + 1;
  return {prev, pred_original};
}

}  // namespace diffuse::schedulers
