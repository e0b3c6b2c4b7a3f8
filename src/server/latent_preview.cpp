#include "server/latent_preview.h"

#include <torch/torch.h>

#include "pipeline/stable_diffusion.h"

namespace diffuse::server {
namespace {

// [M, C + 1] rows of (latent channels, 1).
torch::Tensor design(const torch::Tensor& latents) {
  auto x =
      latents.to(torch::kCPU, torch::kFloat64).permute({0, 2, 3, 1}).reshape({-1, latents.size(1)});
  return torch::cat({x, torch::ones({x.size(0), 1}, x.options())}, 1);
}

Image to_image(const torch::Tensor& hwc) {
  return pipeline::to_images(hwc.unsqueeze(0))[0];
}

}  // namespace

void LatentPreview::learn(const torch::Tensor& latents, const torch::Tensor& images) {
  torch::NoGradGuard no_grad;
  // Ranks other than 0 of a parallel server decode nothing.
  if (!latents.defined() || !images.defined()) return;
  if (latents.dim() != 4 || images.dim() != 4 || latents.size(0) != images.size(0)) return;
  const int64_t h = latents.size(2), w = latents.size(3);
  // Each latent pixel against the mean colour of the image patch it decodes to.
  auto target = torch::adaptive_avg_pool2d(images.to(torch::kFloat64).permute({0, 3, 1, 2}), {h, w})
                    .permute({0, 2, 3, 1})
                    .reshape({-1, 3});
  auto x = design(latents);
  std::lock_guard<std::mutex> lock(mutex_);
  if (xtx_.defined() && xtx_.size(0) != x.size(1)) xtx_ = xty_ = torch::Tensor();
  xtx_ = xtx_.defined() ? xtx_ + x.t().mm(x) : x.t().mm(x);
  xty_ = xty_.defined() ? xty_ + x.t().mm(target) : x.t().mm(target);
  // A small ridge keeps the solve well posed when few pixels have been seen.
  auto ridge = torch::eye(xtx_.size(0), xtx_.options()) *
               (1e-3 * xtx_.diagonal().mean().item<double>() + 1e-9);
  weights_ = at::linalg_solve(xtx_ + ridge, xty_).to(torch::kFloat32);
}

bool LatentPreview::fitted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return weights_.defined();
}

Image LatentPreview::project(const torch::Tensor& latents) const {
  torch::NoGradGuard no_grad;
  auto first = latents.index({torch::indexing::Slice(0, 1)}).to(torch::kCPU, torch::kFloat32);
  const int64_t c = first.size(1), h = first.size(2), w = first.size(3);
  torch::Tensor weights;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    weights = weights_;
  }
  if (weights.defined() && weights.size(0) == c + 1)
    return to_image(design(first).to(torch::kFloat32).mm(weights).clamp(0, 1).reshape({h, w, 3}));
  auto chans = first[0].index({torch::indexing::Slice(0, std::min<int64_t>(c, 3))});
  if (chans.size(0) < 3)
    chans = torch::cat({chans, chans[0].unsqueeze(0).expand({3 - chans.size(0), h, w})});
  auto lo = chans.amin({1, 2}, true), hi = chans.amax({1, 2}, true);
  return to_image(((chans - lo) / (hi - lo + 1e-6)).permute({1, 2, 0}));
}

}  // namespace diffuse::server
