// DeepCache's policy (arXiv 2312.00858): which denoising steps run the whole UNet, and which
// options a UNet accepts. The UNet's two paths are UNet2DConditionModel::forward_deep_cache.
#pragma once
#include <cstdint>
#include <vector>

#include "diffuse/pipeline.h"
#include "models/unet2d_condition.h"

namespace diffuse::accel {

// Checks what needs no model: interval >= 1, ids >= 0. InvalidArgument naming the field.
void validate_deep_cache(const DeepCacheOptions& options);
// And the ids against this UNet: layer_id names a down block, block_id one of its skip
// connections (its resnet pairs, then its downsampler if it has one).
void validate_deep_cache(const DeepCacheOptions& options,
                         const models::UNet2DConditionConfig& unet);

// For each of `steps` loop iterations, whether it runs the whole UNet. Step 0 always does.
// Uniform: every `interval`-th step. Non-uniform: as many full steps, placed at
// steps * (k / count)^kNonUniformPower, so they are denser early, where the image's layout
// forms and the deep features change fastest.
std::vector<bool> deep_cache_full_steps(const DeepCacheOptions& options, int64_t steps);
constexpr double kNonUniformPower = 1.5;

}  // namespace diffuse::accel
