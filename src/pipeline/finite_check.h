// Checks at the boundaries of a generation's stages (text encoding, denoising, decoding) that
// the values are still finite: NaN/Inf would otherwise end as a black PNG and exit 0.
#pragma once
#include <torch/types.h>

#include <string>

namespace diffuse::pipeline {

// NumericalError naming the stage, the device and dtype it ran in, and the likely cause, when
// `values` holds a NaN or Inf. One reduction over the tensor: cheap next to the stage itself.
void check_stage_finite(const torch::Tensor& values, const std::string& stage,
                        const torch::Device& device, torch::Dtype dtype);

// InvalidArgument unless a tensor given as input (latents, noise) is floating point and finite.
void check_input_tensor(const torch::Tensor& values, const std::string& what);

}  // namespace diffuse::pipeline
