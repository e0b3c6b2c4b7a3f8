// DDIMScheduler (Song et al., arXiv:2010.02502), as diffusers 0.30.3 scheduling_ddim.py.
#pragma once
#include "schedulers/scheduler.h"
#include "schedulers/scheduler_config.h"

namespace diffuse::schedulers {

class DDIMScheduler : public Scheduler {
 public:
  // Reads num_train_timesteps, beta_*, trained_betas, clip_sample, clip_sample_range,
  // set_alpha_to_one, steps_offset, prediction_type, thresholding, dynamic_thresholding_ratio,
  // sample_max_value, timestep_spacing, rescale_betas_zero_snr, and "eta" (not a diffusers
  // config key: the pipeline's eta, default 0).
  explicit DDIMScheduler(const SchedulerConfig& config);

  const char* class_name() const override { return "DDIMScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;
  torch::Tensor add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                          const torch::Tensor& timesteps) override;
  void set_eta(double eta) override { eta_ = eta; }
  bool is_stochastic() const override { return eta_ > 0; }

 private:
  PredictionType prediction_type_;
  TimestepSpacing spacing_;
  int64_t steps_offset_;
  bool clip_sample_;
  double clip_sample_range_;
  bool thresholding_;
  double dynamic_thresholding_ratio_;
  double sample_max_value_;
  float final_alpha_cumprod_;
  double eta_;
};

}  // namespace diffuse::schedulers
