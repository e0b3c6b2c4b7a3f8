#include "schedulers/ddim.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "schedulers/step_utils.h"
#include "schedulers/timestep_spacing.h"

namespace diffuse::schedulers {

DDIMScheduler::DDIMScheduler(const SchedulerConfig& config)
    : Scheduler(config.source(),
                alphas_cumprod_from_betas(config.betas("linear", 0.0001, 0.02, true))),
      prediction_type_(config.prediction_type()),
      spacing_(config.timestep_spacing("leading")),
      steps_offset_(config.steps_offset()),
      clip_sample_(config.flag("clip_sample", true)),
      clip_sample_range_(config.number("clip_sample_range", 1.0)),
      thresholding_(config.flag("thresholding", false)),
      dynamic_thresholding_ratio_(config.number("dynamic_thresholding_ratio", 0.995)),
      sample_max_value_(config.number("sample_max_value", 1.0)),
      final_alpha_cumprod_(config.flag("set_alpha_to_one", true) ? 1.0f : alpha_cumprod_at(0)),
      eta_(config.number("eta", 0.0)) {}

void DDIMScheduler::set_timesteps(int n) {
  check_num_inference_steps(n);
  auto t =
      spaced_timesteps(spacing_, num_train_timesteps_, n, steps_offset_, /*round_linspace=*/true);
  std::vector<int64_t> ints(t.begin(), t.end());
  timesteps_ = torch::tensor(ints, torch::kInt64);
  num_inference_steps_ = n;
}

StepOutput DDIMScheduler::step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                               const torch::Tensor& sample, const StepNoise& noise) {
  require_timesteps("step");
  // Scalar coefficients are float32 like diffusers' 0-d tensors, so results match bit for bit.
  const int64_t t = timestep.item<int64_t>();
  const int64_t prev_t = t - num_train_timesteps_ / num_inference_steps_;
  const float alpha_t = alpha_cumprod_at(t);
  const float alpha_prev = prev_t >= 0 ? alpha_cumprod_at(prev_t) : final_alpha_cumprod_;
  const float beta_t = 1.0f - alpha_t;
  const double sqrt_alpha = std::sqrt(alpha_t);
  const double sqrt_beta = std::sqrt(beta_t);

  torch::Tensor pred_original, pred_epsilon;
  switch (prediction_type_) {
    case PredictionType::kEpsilon:
      pred_original = (sample - model_output * sqrt_beta) / sqrt_alpha;
      pred_epsilon = model_output;
      break;
    case PredictionType::kSample:
      pred_original = model_output;
      pred_epsilon = (sample - pred_original * sqrt_alpha) / sqrt_beta;
      break;
    case PredictionType::kVPrediction:
      pred_original = sample * sqrt_alpha - model_output * sqrt_beta;
      pred_epsilon = model_output * sqrt_alpha + sample * sqrt_beta;
      break;
  }
  if (thresholding_)
    pred_original = threshold_sample(pred_original, dynamic_thresholding_ratio_, sample_max_value_);
  else if (clip_sample_)
    pred_original = pred_original.clamp(-clip_sample_range_, clip_sample_range_);

  const float beta_prev = 1.0f - alpha_prev;
  const float variance = (beta_prev / beta_t) * (1.0f - alpha_t / alpha_prev);
  const float std_dev = static_cast<float>(eta_) * std::sqrt(variance);
  const double direction_coeff = std::sqrt(1.0f - alpha_prev - std_dev * std_dev);
  auto prev =
      pred_original * static_cast<double>(std::sqrt(alpha_prev)) + pred_epsilon * direction_coeff;
  if (eta_ > 0)
    prev = prev + step_noise(noise, model_output, "DDIMScheduler") * static_cast<double>(std_dev);
  return {prev, pred_original};
}

torch::Tensor DDIMScheduler::add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                                       const torch::Tensor& timesteps) {
  return add_noise_alphas_cumprod(alphas_cumprod_, original, noise, timesteps, class_name());
}

}  // namespace diffuse::schedulers
