#include "schedulers/step_utils.h"

#include <torch/torch.h>

#include <sstream>

#include "diffuse/errors.h"

namespace diffuse::schedulers {

torch::Tensor step_noise(const StepNoise& noise, const torch::Tensor& like, const char* scheduler) {
  if (noise.noise.defined()) {
    if (noise.noise.sizes() != like.sizes()) {
      std::ostringstream os;
      os << scheduler << ": step noise has shape " << noise.noise.sizes() << ", expected "
         << like.sizes();
      throw InvalidArgument(os.str());
    }
    return noise.noise.to(like.device(), like.scalar_type());
  }
  // Drawn on the CPU so a seed gives the same noise on every device (diffusers' randn_tensor
  // does the same for a CPU generator).
  auto options = torch::TensorOptions().dtype(like.scalar_type()).device(torch::kCPU);
  c10::optional<at::Generator> gen;
  if (noise.generator) gen = *noise.generator;
  return torch::randn(like.sizes(), gen, options).to(like.device());
}

torch::Tensor per_sample(const torch::Tensor& coefficients, const torch::Tensor& like,
                         const char* scheduler) {
  auto c = coefficients.reshape({-1});
  if (like.dim() == 0 || (c.size(0) != 1 && c.size(0) != like.size(0))) {
    std::ostringstream os;
    os << scheduler << ": got " << c.size(0) << " timesteps for a sample of shape " << like.sizes()
       << " (expected one per batch element, or one)";
    throw InvalidArgument(os.str());
  }
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[0] = c.size(0);
  return c.reshape(shape).to(like.device(), like.scalar_type());
}

torch::Tensor threshold_sample(const torch::Tensor& sample, double ratio, double max_value) {
  const auto dtype = sample.scalar_type();
  auto x = sample;
  if (dtype != torch::kFloat32 && dtype != torch::kFloat64) x = x.to(torch::kFloat32);
  const int64_t batch = x.size(0);
  auto flat = x.reshape({batch, -1});
  auto s = torch::quantile(flat.abs(), ratio, /*dim=*/1);
  s = torch::clamp(s, 1.0, max_value).unsqueeze(1);
  flat = torch::max(torch::min(flat, s), -s) / s;
  return flat.reshape(sample.sizes()).to(dtype);
}

torch::Tensor add_noise_alphas_cumprod(const torch::Tensor& alphas_cumprod,
                                       const torch::Tensor& original, const torch::Tensor& noise,
                                       const torch::Tensor& timesteps, const char* scheduler) {
  auto t = timesteps.detach().to(torch::kCPU, torch::kInt64).reshape({-1});
  const int64_t n = alphas_cumprod.size(0);
  if (t.numel() > 0 && (t.min().item<int64_t>() < 0 || t.max().item<int64_t>() >= n))
    throw InvalidArgument(std::string(scheduler) + ": add_noise timesteps must be in [0, " +
                          std::to_string(n) + ")");
  // diffusers casts alphas_cumprod to the sample dtype before taking square roots.
  auto ac = alphas_cumprod.to(original.scalar_type()).index_select(0, t);
  auto sqrt_alpha = per_sample(ac.pow(0.5), original, scheduler);
  auto sqrt_one_minus = per_sample((1 - ac).pow(0.5), original, scheduler);
  return sqrt_alpha * original + sqrt_one_minus * noise.to(original.device());
}

}  // namespace diffuse::schedulers
