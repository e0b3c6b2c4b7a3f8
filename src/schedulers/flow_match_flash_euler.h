// FlashFlowMatchEulerDiscreteScheduler of HiDream-I1 Dev/Fast, as HiDream-ai/HiDream-I1
// hi_diffusers/schedulers/flash_flow_match.py (the same schedule as diffusers' flow-matching
// Euler without shift_terminal and time_shift_type).
#pragma once
#include "schedulers/flow_match.h"

namespace diffuse::schedulers {

class FlashFlowMatchEulerDiscreteScheduler : public FlowMatchScheduler {
 public:
  // Reads the keys FlowMatchScheduler reads, except shift_terminal and time_shift_type,
  // which hi_diffusers does not know (exponential time shift).
  explicit FlashFlowMatchEulerDiscreteScheduler(const SchedulerConfig& config);

  const char* class_name() const override { return "FlashFlowMatchEulerDiscreteScheduler"; }
  // x0 = x - sigma * v; x_next = sigma_next * noise + (1 - sigma_next) * x0 on every step but
  // the last, which draws no noise and returns its input sample unchanged (as hi_diffusers
  // does). pred_original_sample = x0 on every step.
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;
  bool is_stochastic() const override { return true; }
};

}  // namespace diffuse::schedulers
