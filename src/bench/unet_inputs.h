// What the benchmarks feed a UNet with random weights besides sample, timestep and text states:
// SDXL's added conditioning (a random pooled embedding and the time ids of the image size).
#pragma once
#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <optional>

#include "models/unet2d_condition.h"

namespace diffuse::bench {

// nullopt for a UNet without added conditioning; else `batch` rows of a random pooled embedding
// and the base layout's time ids (h, w, 0, 0, h, w) of a width x height image.
std::optional<models::UNetAddedConditions> random_added_conditions(
    const models::UNet2DConditionConfig& unet, int64_t batch, int64_t height, int64_t width,
    at::Generator& gen, const torch::Device& device, torch::Dtype dtype);

// The pointer a UNet forward takes: null without added conditioning.
inline const models::UNetAddedConditions* added_or_null(
    const std::optional<models::UNetAddedConditions>& added) {
  return added ? &*added : nullptr;
}

}  // namespace diffuse::bench
