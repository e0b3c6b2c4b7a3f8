// EulerAncestralDiscreteScheduler (ancestral sampling with Euler steps, as k-diffusion's
// sample_euler_ancestral), as diffusers 0.30.3 scheduling_euler_ancestral_discrete.py.
#pragma once
#include "schedulers/sigma_scheduler.h"

namespace diffuse::schedulers {

class EulerAncestralDiscreteScheduler : public SigmaScheduler {
 public:
  // Reads num_train_timesteps, beta_*, trained_betas, prediction_type (epsilon |
  // v_prediction), timestep_spacing, steps_offset, rescale_betas_zero_snr.
  explicit EulerAncestralDiscreteScheduler(const SchedulerConfig& config);

  bool is_stochastic() const override { return true; }
  const char* class_name() const override { return "EulerAncestralDiscreteScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  // Each step adds noise * sigma_up: `noise` supplies it (or its generator draws it).
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;

 private:
  PredictionType prediction_type_;
  SigmaScheduleOptions options_;
};

}  // namespace diffuse::schedulers
