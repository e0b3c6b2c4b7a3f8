// LMSDiscreteScheduler (linear multistep over sigma, order 4, as k-diffusion's sample_lms), as
// diffusers 0.30.3 scheduling_lms_discrete.py. The multistep coefficients are integrals of
// Lagrange basis polynomials, computed numerically (diffusers uses scipy.integrate.quad).
#pragma once
#include <deque>

#include "schedulers/sigma_scheduler.h"

namespace diffuse::schedulers {

class LMSDiscreteScheduler : public SigmaScheduler {
 public:
  // Reads num_train_timesteps, beta_*, trained_betas, use_karras_sigmas, prediction_type,
  // timestep_spacing, steps_offset.
  explicit LMSDiscreteScheduler(const SchedulerConfig& config);

  const char* class_name() const override { return "LMSDiscreteScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;

  // The coefficient of the derivative `current_order` steps back for the step from sigma[t]
  // to sigma[t + 1] with a method of `order` (diffusers' get_lms_coefficient).
  double lms_coefficient(int order, int64_t t, int current_order) const;

 private:
  static constexpr int kOrder = 4;
  PredictionType prediction_type_;
  SigmaScheduleOptions options_;
  std::deque<torch::Tensor> derivatives_;  // most recent last, at most kOrder
};

}  // namespace diffuse::schedulers
