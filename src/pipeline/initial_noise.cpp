#include "pipeline/initial_noise.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <string>

#include "diffuse/errors.h"
#include "pipeline/finite_check.h"

namespace diffuse::pipeline {

torch::Tensor initial_flow_latents(const torch::Tensor& given, uint64_t seed, int64_t channels,
                                   int64_t h, int64_t w, const torch::Device& device) {
  if (given.defined()) {
    if (given.dim() != 4 || given.size(0) != 1 || given.size(1) != channels || given.size(2) != h ||
        given.size(3) != w)
      throw InvalidArgument("initial latents must be [1, " + std::to_string(channels) + ", " +
                            std::to_string(h) + ", " + std::to_string(w) + "], got " +
                            c10::str(given.sizes()));
    check_input_tensor(given, "given latents");
    return given.to(device, torch::kFloat32);
  }
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randn({1, channels, h, w}, gen, torch::kFloat32).to(device);
}

}  // namespace diffuse::pipeline
