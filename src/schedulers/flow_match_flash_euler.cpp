#include "schedulers/flow_match_flash_euler.h"

#include <torch/torch.h>

#include "schedulers/step_utils.h"

namespace diffuse::schedulers {

FlashFlowMatchEulerDiscreteScheduler::FlashFlowMatchEulerDiscreteScheduler(
    const SchedulerConfig& config)
    : FlowMatchScheduler(config, /*terminal_and_type=*/false) {}

StepOutput FlashFlowMatchEulerDiscreteScheduler::step(const torch::Tensor& model_output,
                                                      const torch::Tensor& timestep,
                                                      const torch::Tensor& sample_in,
                                                      const StepNoise& noise) {
  const auto s = begin_step(timestep);
  auto sample = sample_in.to(torch::kFloat32);
  auto pred_original = sample - model_output * static_cast<double>(s.sigma);
  // hi_diffusers keeps the input on the last step (the image is the sample at the last sigma,
  // not x0); the golden trajectories confirm it, so do not "fix" this.
  torch::Tensor prev = sample;
  if (s.index < num_inference_steps_ - 1) {
    auto fresh = step_noise(noise, pred_original, class_name());
    prev = fresh * static_cast<double>(s.sigma_next) +
           pred_original * static_cast<double>(1.0f - s.sigma_next);
  }
  step_index_ = s.index + 1;
  return {prev.to(model_output.scalar_type()), pred_original};
}

}  // namespace diffuse::schedulers
