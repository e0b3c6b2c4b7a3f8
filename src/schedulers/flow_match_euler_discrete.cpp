#include "schedulers/flow_match_euler_discrete.h"

#include <torch/torch.h>

#include "schedulers/step_utils.h"

namespace diffuse::schedulers {

FlowMatchEulerDiscreteScheduler::FlowMatchEulerDiscreteScheduler(const SchedulerConfig& config)
    : FlowMatchScheduler(config, /*terminal_and_type=*/true),
      stochastic_(config.flag("stochastic_sampling", false)) {}

StepOutput FlowMatchEulerDiscreteScheduler::step(const torch::Tensor& model_output,
                                                 const torch::Tensor& timestep,
                                                 const torch::Tensor& sample_in,
                                                 const StepNoise& noise) {
  const auto s = begin_step(timestep);
  // diffusers upcasts the sample only; sigma * v stays in the model output's dtype.
  auto sample = sample_in.to(torch::kFloat32);
  auto pred_original = sample - model_output * static_cast<double>(s.sigma);
  torch::Tensor prev;
  if (stochastic_) {
    auto fresh = step_noise(noise, sample, class_name());
    prev = pred_original * static_cast<double>(1.0f - s.sigma_next) +
           fresh * static_cast<double>(s.sigma_next);
  } else {
    const float dt = s.sigma_next - s.sigma;
    prev = sample + model_output * static_cast<double>(dt);
  }
  step_index_ = s.index + 1;
  return {prev.to(model_output.scalar_type()), pred_original};
}

}  // namespace diffuse::schedulers
