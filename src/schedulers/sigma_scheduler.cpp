#include "schedulers/sigma_scheduler.h"

#include <torch/torch.h>

#include <cmath>

#include "schedulers/numpy_ops.h"
#include "schedulers/step_utils.h"
#include "schedulers/timestep_spacing.h"

namespace diffuse::schedulers {
namespace {

std::vector<float> to_floats(const torch::Tensor& t) {
  auto c = t.to(torch::kCPU, torch::kFloat32).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

}  // namespace

torch::Tensor sigma_alphas_cumprod(const SchedulerConfig& config) {
  auto ac = alphas_cumprod_from_betas(config.betas("linear", 0.0001, 0.02, true));
  if (config.flag("rescale_betas_zero_snr", false)) ac[-1] = std::ldexp(1.0, -24);
  return ac;
}

torch::Tensor training_sigmas(const torch::Tensor& alphas_cumprod) {
  return ((1 - alphas_cumprod) / alphas_cumprod).pow(0.5);
}

SigmaSchedule make_sigma_schedule(const torch::Tensor& alphas_cumprod, int n,
                                  const SigmaScheduleOptions& options) {
  const int64_t T = alphas_cumprod.size(0);
  // Timesteps are float32 in diffusers before the sigmas are interpolated at them.
  std::vector<double> timesteps;
  for (double t : spaced_timesteps(options.spacing, T, n, options.steps_offset, false))
    timesteps.push_back(static_cast<float>(t));

  const std::vector<float> train = to_floats(training_sigmas(alphas_cumprod));
  const std::vector<double> train_d(train.begin(), train.end());
  std::vector<double> log_sigmas;  // numpy log of a float32 array: float32 values
  for (float s : train) log_sigmas.push_back(std::log(s));

  std::vector<double> sigmas;
  if (options.log_linear) {
    auto s = torch::linspace(static_cast<double>(std::log(train.back())),
                             static_cast<double>(std::log(train.front())), n + 1, torch::kFloat32)
                 .exp();
    for (float v : to_floats(s)) sigmas.push_back(v);
  } else {
    sigmas = np::interp_on_index_grid(timesteps, train_d);
  }
  if (options.karras) {
    const double lo = options.sigma_min ? *options.sigma_min : sigmas.back();
    const double hi = options.sigma_max ? *options.sigma_max : sigmas.front();
    sigmas = np::karras_sigmas(lo, hi, n);
    timesteps.clear();
    for (double s : sigmas) timesteps.push_back(np::sigma_to_t(s, log_sigmas));
  }
  double last = 0.0;
  if (options.final_sigma_min) {
    const float a0 = alphas_cumprod[0].item<float>();
    last = std::sqrt((1.0f - a0) / a0);
  }

  SigmaSchedule out;
  for (double t : timesteps) out.timesteps.push_back(static_cast<float>(t));
  for (double s : sigmas) out.sigmas.push_back(static_cast<float>(s));
  out.sigmas.push_back(static_cast<float>(last));
  return out;
}

SigmaScheduler::SigmaScheduler(const SchedulerConfig& config, torch::Tensor alphas_cumprod,
                               TimestepSpacing spacing)
    : Scheduler(config.source(), std::move(alphas_cumprod)), spacing_(spacing) {
  // Before set_timesteps diffusers holds the full training sigmas (descending) plus 0; this
  // is what init_noise_sigma reports until then.
  auto s = training_sigmas(alphas_cumprod_).flip(0);
  sigmas_ = torch::cat({s, torch::zeros({1}, torch::kFloat32)});
}

void SigmaScheduler::install(const SigmaSchedule& schedule, int n) {
  timesteps_ = torch::tensor(schedule.timesteps, torch::kFloat32);
  sigmas_ = torch::tensor(schedule.sigmas, torch::kFloat32);
  num_inference_steps_ = n;
  reset_step_index();
}

double SigmaScheduler::init_noise_sigma() const {
  const float max_sigma = sigmas_.max().item<float>();
  if (spacing_ == TimestepSpacing::kLeading) return std::sqrt(max_sigma * max_sigma + 1.0f);
  return max_sigma;
}

torch::Tensor SigmaScheduler::scale_model_input(const torch::Tensor& sample,
                                                const torch::Tensor& timestep) {
  require_timesteps("scale_model_input");
  init_step_index(timestep);
  const float sigma = sigma_at(*step_index_);
  return sample / static_cast<double>(std::sqrt(sigma * sigma + 1.0f));
}

torch::Tensor SigmaScheduler::add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                                        const torch::Tensor& timesteps) {
  auto indices = noise_step_indices(timesteps);
  auto sigma =
      sigmas_.to(original.scalar_type()).index_select(0, torch::tensor(indices, torch::kInt64));
  return original + noise.to(original.device()) * per_sample(sigma, original, class_name());
}

torch::Tensor predict_original_sample(PredictionType type, const torch::Tensor& sample,
                                      const torch::Tensor& model_output, float sigma) {
  switch (type) {
    case PredictionType::kEpsilon:
      return sample - model_output * static_cast<double>(sigma);
    case PredictionType::kVPrediction: {
      const float c_out = -sigma / std::sqrt(sigma * sigma + 1.0f);
      return model_output * static_cast<double>(c_out) +
             sample / static_cast<double>(sigma * sigma + 1.0f);
    }
    case PredictionType::kSample:
      break;
  }
  return model_output;
}

}  // namespace diffuse::schedulers
