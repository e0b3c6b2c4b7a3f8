// Small tensor helpers shared by the scheduler implementations.
#pragma once
#include <torch/types.h>

#include <vector>

#include "schedulers/scheduler.h"

namespace diffuse::schedulers {

// The noise for a stochastic step shaped like `like` on its device and dtype: the supplied
// tensor (InvalidArgument if its shape differs), else drawn on the CPU from the generator.
torch::Tensor step_noise(const StepNoise& noise, const torch::Tensor& like, const char* scheduler);

// Per-batch-element coefficients [B] reshaped to [B, 1, ..., 1] to broadcast against `like`,
// on its device and dtype. InvalidArgument unless B is 1 or like.size(0).
torch::Tensor per_sample(const torch::Tensor& coefficients, const torch::Tensor& like,
                         const char* scheduler);

// Dynamic thresholding (Imagen): clamp to the `ratio` quantile of |x| per sample, clamped to
// [1, max_value], and divide by it. Computed in float32 at least.
torch::Tensor threshold_sample(const torch::Tensor& sample, double ratio, double max_value);

// add_noise for schedulers defined on alphas_cumprod (DDIM, PNDM):
// sqrt(a_t) * original + sqrt(1 - a_t) * noise, in the sample's dtype.
torch::Tensor add_noise_alphas_cumprod(const torch::Tensor& alphas_cumprod,
                                       const torch::Tensor& original, const torch::Tensor& noise,
                                       const torch::Tensor& timesteps, const char* scheduler);

}  // namespace diffuse::schedulers
