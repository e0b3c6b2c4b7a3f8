// Tensors given to the CLI in safetensors files: initial latents, img2img noise, and the
// per-step noise of stochastic schedulers (what golden sets and other tools supply to replay
// a run exactly).
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

namespace diffuse::app {

// The single tensor of a safetensors file, or the one named `name`. FormatError otherwise.
torch::Tensor read_tensor_file(const std::string& path, const std::string& name);

// The tensors named noise.0, noise.1, ... of a safetensors file, in step order (a gap ends the
// list). FormatError when there is none.
std::vector<torch::Tensor> read_step_noise_file(const std::string& path);

}  // namespace diffuse::app
