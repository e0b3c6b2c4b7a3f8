#include "schedulers/flow_match_lcm.h"

#include <torch/torch.h>

#include "schedulers/step_utils.h"

namespace diffuse::schedulers {

FlowMatchLCMScheduler::FlowMatchLCMScheduler(const SchedulerConfig& config)
    : FlowMatchScheduler(config, /*terminal_and_type=*/true) {
  // diffusers only rescales when both are set (and non-empty).
  const auto& j = config.json().json();
  const bool scale_wise = j.contains("scale_factors") && j["scale_factors"].is_array() &&
                          !j["scale_factors"].empty() &&
                          !config.json().get<std::string>("upscale_mode", "bicubic").empty();
  if (scale_wise)
    config.fail("scale_factors",
                "scale-wise generation (upscaling x0 between steps) is not "
                "supported; expected null");
}

StepOutput FlowMatchLCMScheduler::step(const torch::Tensor& model_output,
                                       const torch::Tensor& timestep,
                                       const torch::Tensor& sample_in, const StepNoise& noise) {
  const auto s = begin_step(timestep);
  auto sample = sample_in.to(torch::kFloat32);
  auto pred_original = sample - model_output * static_cast<double>(s.sigma);
  auto fresh = step_noise(noise, pred_original, class_name());
  auto prev = pred_original * static_cast<double>(1.0f - s.sigma_next) +
              fresh * static_cast<double>(s.sigma_next);
  step_index_ = s.index + 1;
  return {prev.to(model_output.scalar_type()), pred_original};
}

}  // namespace diffuse::schedulers
