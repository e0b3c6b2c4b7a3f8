// Shared base of the k-diffusion style schedulers that work on sigma = sqrt((1 - a) / a)
// (Euler, Euler ancestral, LMS): the sigma schedule, init_noise_sigma, the input scaling
// x / sqrt(sigma^2 + 1), and add_noise x + sigma * noise, as diffusers 0.30.3.
#pragma once
#include <optional>
#include <vector>

#include "schedulers/scheduler.h"
#include "schedulers/scheduler_config.h"

namespace diffuse::schedulers {

// alphas_cumprod of Euler, Euler ancestral and DPM-Solver: with rescale_betas_zero_snr the
// last value is set to 2^-24 instead of 0 so that sigma stays finite, as diffusers does.
torch::Tensor sigma_alphas_cumprod(const SchedulerConfig& config);

// ((1 - a) / a) ** 0.5 in float32 (ascending with the training timestep), as diffusers.
torch::Tensor training_sigmas(const torch::Tensor& alphas_cumprod);

struct SigmaScheduleOptions {
  TimestepSpacing spacing = TimestepSpacing::kLinspace;
  int64_t steps_offset = 0;
  bool log_linear = false;                     // Euler's interpolation_type "log_linear"
  bool karras = false;                         // use_karras_sigmas
  std::optional<double> sigma_min, sigma_max;  // Karras range overrides (Euler's config)
  bool final_sigma_min = false;                // final_sigmas_type "sigma_min" (else 0)
};

struct SigmaSchedule {
  std::vector<float> timesteps;  // float32, descending
  std::vector<float> sigmas;     // float32, timesteps.size() + 1 entries (final one appended)
};

// The schedule for n inference steps: spaced (fractional) timesteps, sigmas interpolated
// linearly in the training timestep (or log-linear / Karras), then the final sigma.
SigmaSchedule make_sigma_schedule(const torch::Tensor& alphas_cumprod, int n,
                                  const SigmaScheduleOptions& options);

// The denoised sample x0 predicted at noise level `sigma` (k-diffusion parameterisation, as
// the Euler-family schedulers of diffusers compute it in float32).
torch::Tensor predict_original_sample(PredictionType type, const torch::Tensor& sample,
                                      const torch::Tensor& model_output, float sigma);

class SigmaScheduler : public Scheduler {
 public:
  double init_noise_sigma() const override;
  torch::Tensor scale_model_input(const torch::Tensor& sample,
                                  const torch::Tensor& timestep) override;
  torch::Tensor add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                          const torch::Tensor& timesteps) override;

 protected:
  SigmaScheduler(const SchedulerConfig& config, torch::Tensor alphas_cumprod,
                 TimestepSpacing spacing);
  // Installs a schedule: timesteps_, sigmas_, num_inference_steps_, and resets the step index.
  void install(const SigmaSchedule& schedule, int n);

  TimestepSpacing spacing_;
};

}  // namespace diffuse::schedulers
