// Cheap previews while a job runs: latents mapped to RGB by a linear map (no VAE). The map is
// fitted by least squares on the final latents and decoded images of finished jobs, so it
// fits whatever VAE the model has; before the first job ends, the first three latent channels
// are shown, each normalised.
#pragma once
#include <torch/types.h>

#include <mutex>
#include <string>

#include "diffuse/image.h"

namespace diffuse::server {

class LatentPreview {
 public:
  // latents [N, C, h, w]; images [N, H, W, 3] float in [0, 1] (H, W multiples of h, w).
  void learn(const torch::Tensor& latents, const torch::Tensor& images);
  // The first image of the batch [N, C, h, w] at latent resolution.
  Image project(const torch::Tensor& latents) const;
  bool fitted() const;

 private:
  mutable std::mutex mutex_;
  torch::Tensor xtx_, xty_;  // normal equations, float64
  torch::Tensor weights_;    // [C + 1, 3] float32
};

}  // namespace diffuse::server
