// The initial latents of a flow-matching run (HiDream, FLUX).
#pragma once
#include <torch/types.h>

#include <cstdint>

namespace diffuse::pipeline {

// [1, channels, h, w] float32 on `device`: `given` when defined (InvalidArgument naming the
// expected shape, or for non-finite values), else drawn from `seed` on the CPU with PyTorch's
// generator, so that a seed gives the same image on every device and the same latents as
// diffusers with torch.Generator("cpu").manual_seed(seed).
torch::Tensor initial_flow_latents(const torch::Tensor& given, uint64_t seed, int64_t channels,
                                   int64_t h, int64_t w, const torch::Device& device);

}  // namespace diffuse::pipeline
