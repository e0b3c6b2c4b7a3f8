// FlowMatchEulerDiscreteScheduler (Euler steps along the predicted velocity), as diffusers 0.34
// scheduling_flow_match_euler_discrete.py: the scheduler of SD3, Flux and HiDream-I1.
#pragma once
#include "schedulers/flow_match.h"

namespace diffuse::schedulers {

class FlowMatchEulerDiscreteScheduler : public FlowMatchScheduler {
 public:
  // Reads the keys FlowMatchScheduler reads (shift_terminal and time_shift_type included) and
  // stochastic_sampling.
  explicit FlowMatchEulerDiscreteScheduler(const SchedulerConfig& config);

  const char* class_name() const override { return "FlowMatchEulerDiscreteScheduler"; }
  // x_next = x + (sigma_next - sigma) * v; with stochastic_sampling, the predicted x0 is
  // re-noised to sigma_next instead. pred_original_sample = x - sigma * v.
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;
  bool is_stochastic() const override { return stochastic_; }

 private:
  bool stochastic_;
};

}  // namespace diffuse::schedulers
