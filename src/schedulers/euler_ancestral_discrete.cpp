#include "schedulers/euler_ancestral_discrete.h"

#include <torch/torch.h>

#include <cmath>

#include "schedulers/step_utils.h"

namespace diffuse::schedulers {

EulerAncestralDiscreteScheduler::EulerAncestralDiscreteScheduler(const SchedulerConfig& config)
    : SigmaScheduler(config, sigma_alphas_cumprod(config), config.timestep_spacing("linspace")),
      // diffusers raises NotImplementedError for "sample" at the first step; fail early instead.
      prediction_type_(config.prediction_type({"epsilon", "v_prediction"})) {
  options_.spacing = spacing_;
  options_.steps_offset = config.steps_offset();
}

void EulerAncestralDiscreteScheduler::set_timesteps(int n) {
  check_num_inference_steps(n);
  install(make_sigma_schedule(alphas_cumprod_, n, options_), n);
}

StepOutput EulerAncestralDiscreteScheduler::step(const torch::Tensor& model_output,
                                                 const torch::Tensor& timestep,
                                                 const torch::Tensor& sample_in,
                                                 const StepNoise& noise) {
  require_timesteps("step");
  init_step_index(timestep);
  const int64_t i = *step_index_;
  const float sigma = sigma_at(i);
  const float sigma_to = sigma_at(i + 1);
  auto sample = sample_in.to(torch::kFloat32);
  auto pred_original = predict_original_sample(prediction_type_, sample, model_output, sigma);
  // Split the step to sigma_to into a deterministic part down to sigma_down and fresh noise
  // of size sigma_up, with sigma_down^2 + sigma_up^2 = sigma_to^2.
  const float sigma_up =
      std::sqrt(sigma_to * sigma_to * (sigma * sigma - sigma_to * sigma_to) / (sigma * sigma));
  const float sigma_down = std::sqrt(sigma_to * sigma_to - sigma_up * sigma_up);
  auto derivative = (sample - pred_original) / static_cast<double>(sigma);
  const float dt = sigma_down - sigma;
  auto prev = sample + derivative * static_cast<double>(dt);
  prev = prev + step_noise(noise, model_output, class_name()) * static_cast<double>(sigma_up);
  step_index_ = i + 1;
  return {prev.to(model_output.scalar_type()), pred_original};
}

}  // namespace diffuse::schedulers
