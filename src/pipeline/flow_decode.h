// The decode stage of the flow-matching pipelines (HiDream, FLUX): latents [B, C, h, w] ->
// images [B, H, W, 3] float32 in [0, 1] on the CPU, through the VAE's own latent scaling and
// shift (force_upcast: float32), tiled when the tiling policy says so; records the stage's
// time and memory.
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

#include "diffuse/pipeline.h"
#include "models/autoencoder_kl.h"

namespace diffuse::pipeline {

// NumericalError if the decoded image is not finite. A tiling warning goes to `warnings`.
torch::Tensor decode_flow_latents(models::AutoencoderKL& vae, const torch::Tensor& latents,
                                  const VaeTilingOptions& tiling, const torch::Device& vae_device,
                                  StageTimings& timings, std::vector<std::string>& warnings);

}  // namespace diffuse::pipeline
