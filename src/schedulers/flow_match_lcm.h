// FlowMatchLCMScheduler (latent-consistency sampling on a flow-matching schedule), as diffusers
// 0.34 scheduling_flow_match_lcm.py: every step predicts x0 and re-noises it to the next sigma.
#pragma once
#include "schedulers/flow_match.h"

namespace diffuse::schedulers {

class FlowMatchLCMScheduler : public FlowMatchScheduler {
 public:
  // Reads the keys FlowMatchScheduler reads (shift_terminal and time_shift_type included);
  // scale_factors (scale-wise generation) is refused with a ConfigError.
  explicit FlowMatchLCMScheduler(const SchedulerConfig& config);

  const char* class_name() const override { return "FlowMatchLCMScheduler"; }
  // x0 = x - sigma * v; x_next = (1 - sigma_next) * x0 + sigma_next * noise. Noise is drawn on
  // every step, the last (sigma_next = 0) included, so a generator advances as in diffusers.
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;
  bool is_stochastic() const override { return true; }
};

}  // namespace diffuse::schedulers
