#include "pipeline/denoised_estimate.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"

namespace diffuse::pipeline {

torch::Tensor ddpm_denoised(const torch::Tensor& model_input, const torch::Tensor& model_output,
                            double t, const torch::Tensor& alphas_cumprod,
                            const std::string& prediction_type) {
  if (prediction_type == "sample") return model_output;
  const int64_t n = alphas_cumprod.numel();
  if (!(t >= 0 && t <= static_cast<double>(n - 1)))
    throw InvalidArgument("denoised estimate: timestep " + std::to_string(t) +
                          " is outside the training schedule [0, " + std::to_string(n - 1) + "]");
  auto sigma_at = [&](int64_t i) {
    const double a = alphas_cumprod[i].item<double>();
    return std::sqrt((1 - a) / a);
  };
  const auto lo = static_cast<int64_t>(std::floor(t));
  const int64_t hi = std::min(lo + 1, n - 1);
  const double frac = t - static_cast<double>(lo);
  const double sigma = (1 - frac) * sigma_at(lo) + frac * sigma_at(hi);
  const double alpha = 1 / (1 + sigma * sigma);  // alpha_bar at t
  const double sa = std::sqrt(alpha), s1a = std::sqrt(1 - alpha);
  if (prediction_type == "epsilon") return (model_input - s1a * model_output) / sa;
  if (prediction_type == "v_prediction") return sa * model_input - s1a * model_output;
  throw InvalidArgument("denoised estimate: unknown prediction_type '" + prediction_type +
                        "' (expected epsilon, v_prediction or sample)");
}

torch::Tensor flow_denoised(const torch::Tensor& latents, const torch::Tensor& velocity,
                            double sigma) {
  return latents - sigma * velocity;
}

std::string interrupted_warning(int64_t steps_run, int64_t total) {
  return "interrupted after step " + std::to_string(steps_run) + " of " + std::to_string(total) +
         ": the image is that step's denoised estimate";
}

}  // namespace diffuse::pipeline
