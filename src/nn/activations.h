// The activation functions diffusers' get_activation() knows, selected by config name.
#pragma once
#include <torch/types.h>

#include <string>

namespace diffuse::nn {

enum class Activation { kSilu, kMish, kGelu, kRelu };

// "silu"/"swish", "mish", "gelu", "relu" (case-insensitive, as diffusers lowercases them).
// Throws ConfigError naming `where` (e.g. "unet/config.json: key 'act_fn'") otherwise.
Activation parse_activation(const std::string& name, const std::string& where);

torch::Tensor apply_activation(const torch::Tensor& x, Activation act);

}  // namespace diffuse::nn
