// DPMSolverMultistepScheduler (DPM-Solver / DPM-Solver++, Lu et al., arXiv:2206.00927 and
// arXiv:2211.01095), as diffusers 0.30.3 scheduling_dpmsolver_multistep.py. The defaults
// (dpmsolver++, solver_order 2, midpoint, lower_order_final) are "DPM++ 2M".
#pragma once
#include <optional>
#include <vector>

#include "schedulers/scheduler.h"
#include "schedulers/scheduler_config.h"

namespace diffuse::schedulers {

class DPMSolverMultistepScheduler : public Scheduler {
 public:
  enum class Algorithm { kDpmSolver, kDpmSolverPP, kSdeDpmSolver, kSdeDpmSolverPP };

  // Reads num_train_timesteps, beta_*, trained_betas, solver_order (1..3), prediction_type,
  // thresholding, dynamic_thresholding_ratio, sample_max_value, algorithm_type, solver_type
  // (midpoint | heun), lower_order_final, euler_at_final, use_karras_sigmas, use_lu_lambdas,
  // sigma_min, sigma_max, final_sigmas_type, lambda_min_clipped, variance_type,
  // timestep_spacing, steps_offset, rescale_betas_zero_snr.
  explicit DPMSolverMultistepScheduler(const SchedulerConfig& config);

  const char* class_name() const override { return "DPMSolverMultistepScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  // The SDE variants add noise each step (from `noise`); the others ignore it.
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;
  torch::Tensor add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                          const torch::Tensor& timesteps) override;

 private:
  // alpha_t = 1 / sqrt(sigma^2 + 1), sigma_t = sigma * alpha_t, lambda = log(alpha) - log(sigma).
  struct Point {
    float alpha, sigma, lambda;
  };
  Point point(int64_t index) const;
  torch::Tensor convert_model_output(torch::Tensor model_output, const torch::Tensor& sample) const;
  torch::Tensor first_order_update(const torch::Tensor& x, const torch::Tensor& sample,
                                   const torch::Tensor& noise) const;
  torch::Tensor second_order_update(const torch::Tensor& sample, const torch::Tensor& noise) const;
  torch::Tensor third_order_update(const torch::Tensor& sample) const;
  bool is_stochastic() const override { return is_sde(); }
  bool is_sde() const {
    return algorithm_ == Algorithm::kSdeDpmSolver || algorithm_ == Algorithm::kSdeDpmSolverPP;
  }
  bool is_data_prediction() const {
    return algorithm_ == Algorithm::kDpmSolverPP || algorithm_ == Algorithm::kSdeDpmSolverPP;
  }

  int solver_order_;
  PredictionType prediction_type_;
  bool thresholding_;
  double dynamic_thresholding_ratio_;
  double sample_max_value_;
  Algorithm algorithm_;
  bool heun_;
  bool lower_order_final_;
  bool euler_at_final_;
  bool karras_;
  bool lu_lambdas_;
  std::optional<double> sigma_min_, sigma_max_;
  bool final_sigma_min_;
  double lambda_min_clipped_;
  bool learned_variance_;
  TimestepSpacing spacing_;
  int64_t steps_offset_;
  torch::Tensor lambda_t_;  // float32 [num_train_timesteps]

  // Per-run state, reset by set_timesteps.
  std::vector<torch::Tensor> model_outputs_;  // solver_order slots, most recent last
  int lower_order_nums_ = 0;
};

}  // namespace diffuse::schedulers
