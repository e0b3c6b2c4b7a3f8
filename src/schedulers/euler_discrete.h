// EulerDiscreteScheduler (Algorithm 2 of Karras et al., arXiv:2206.00364, without churn), as
// diffusers 0.30.3 scheduling_euler_discrete.py.
#pragma once
#include "schedulers/sigma_scheduler.h"

namespace diffuse::schedulers {

class EulerDiscreteScheduler : public SigmaScheduler {
 public:
  // Reads num_train_timesteps, beta_*, trained_betas, prediction_type, interpolation_type
  // (linear | log_linear), use_karras_sigmas, sigma_min, sigma_max, timestep_spacing,
  // timestep_type (discrete | continuous), steps_offset, rescale_betas_zero_snr,
  // final_sigmas_type (zero | sigma_min).
  explicit EulerDiscreteScheduler(const SchedulerConfig& config);

  const char* class_name() const override { return "EulerDiscreteScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;

 private:
  PredictionType prediction_type_;
  SigmaScheduleOptions options_;
  bool continuous_timesteps_;  // timestep_type "continuous" with v_prediction: t = log(sigma)/4
};

}  // namespace diffuse::schedulers
