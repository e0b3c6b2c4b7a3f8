// PNDMScheduler (pseudo numerical methods, Liu et al., arXiv:2202.09778), as diffusers 0.30.3
// scheduling_pndm.py: Runge-Kutta warm-up steps (unless skip_prk_steps, which Stable
// Diffusion uses) followed by linear multistep (PLMS) steps.
#pragma once
#include <vector>

#include "schedulers/scheduler.h"
#include "schedulers/scheduler_config.h"

namespace diffuse::schedulers {

class PNDMScheduler : public Scheduler {
 public:
  // Reads num_train_timesteps, beta_*, trained_betas, skip_prk_steps, set_alpha_to_one,
  // prediction_type (epsilon | v_prediction), timestep_spacing, steps_offset.
  explicit PNDMScheduler(const SchedulerConfig& config);

  const char* class_name() const override { return "PNDMScheduler"; }
  // With skip_prk_steps the schedule has num_inference_steps + 1 entries (the first PLMS step
  // is taken twice); without, 12 Runge-Kutta entries plus num_inference_steps - 3 (needs >= 4
  // steps).
  void set_timesteps(int num_inference_steps) override;
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;
  torch::Tensor add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                          const torch::Tensor& timesteps) override;

 private:
  torch::Tensor step_prk(const torch::Tensor& model_output, int64_t timestep,
                         const torch::Tensor& sample);
  torch::Tensor step_plms(const torch::Tensor& model_output, int64_t timestep,
                          torch::Tensor sample);
  torch::Tensor prev_sample(const torch::Tensor& sample, int64_t t, int64_t prev_t,
                            torch::Tensor model_output) const;

  PredictionType prediction_type_;
  TimestepSpacing spacing_;
  int64_t steps_offset_;
  bool skip_prk_steps_;
  float final_alpha_cumprod_;

  // Per-run state, reset by set_timesteps.
  std::vector<int64_t> prk_timesteps_;
  std::vector<torch::Tensor> ets_;  // recent model outputs (at most 4)
  torch::Tensor cur_model_output_;  // Runge-Kutta accumulator; undefined = 0
  torch::Tensor cur_sample_;
  int64_t counter_ = 0;
};

}  // namespace diffuse::schedulers
