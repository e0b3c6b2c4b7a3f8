// When the pipelines run the VAE in tiles (GenerationConfig::vae_tiling) and what the VAE
// then needs in memory, for Stable Diffusion and HiDream alike.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "diffuse/pipeline.h"
#include "models/autoencoder_kl.h"
#include "models/vae_tiling.h"

namespace diffuse::pipeline {

// InvalidArgument naming the field for a mode other than auto|on|off, a negative or too large
// tile size, or an overlap outside [0, 0.5] (the tile is checked against the VAE later).
void validate_vae_tiling_options(const VaeTilingOptions& options);

struct VaeTilingChoice {
  std::optional<models::VaeTiling> tiling;  // unset: the whole image at once
  std::string warning;                      // set when auto tiled only to fit in memory
};

// The choice for `images` images of height x width pixels run by a VAE on `device` in
// `dtype`. Deterministic except where the untiled pass would not fit (auto then tiles rather
// than fail, and says so).
VaeTilingChoice choose_vae_tiling(const VaeTilingOptions& options,
                                  const models::AutoencoderKLConfig& config, int64_t images,
                                  int64_t height, int64_t width, torch::Device device,
                                  torch::Dtype dtype);

// A lower bound of the VAE's working set for that pass (its top level's input, hidden state
// and residual at once), over one tile when tiled.
int64_t vae_working_bytes(const models::AutoencoderKLConfig& config,
                          const std::optional<models::VaeTiling>& tiling, int64_t images,
                          int64_t height, int64_t width, torch::Dtype dtype);

// vae.decode / vae.encode, tiled or not.
torch::Tensor vae_decode(models::AutoencoderKLImpl& vae, const torch::Tensor& z,
                         const std::optional<models::VaeTiling>& tiling);
models::LatentDist vae_encode(models::AutoencoderKLImpl& vae, const torch::Tensor& x,
                              const std::optional<models::VaeTiling>& tiling);

}  // namespace diffuse::pipeline
