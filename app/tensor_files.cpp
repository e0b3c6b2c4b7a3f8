#include "tensor_files.h"

#include <torch/torch.h>

#include "diffuse/errors.h"
#include "io/safetensors.h"

namespace diffuse::app {

torch::Tensor read_tensor_file(const std::string& path, const std::string& name) {
  auto file = io::SafetensorsFile::open(path);
  if (file->contains(name)) return file->get(name).clone();
  if (file->names().size() == 1) return file->get(file->names()[0]).clone();
  throw FormatError(path + ": expected a tensor named '" + name + "' or exactly one tensor");
}

std::vector<torch::Tensor> read_step_noise_file(const std::string& path) {
  auto file = io::SafetensorsFile::open(path);
  std::vector<torch::Tensor> noise;
  for (size_t k = 0; file->contains("noise." + std::to_string(k)); ++k)
    noise.push_back(file->get("noise." + std::to_string(k)).clone());
  if (noise.empty())
    throw FormatError(path + ": expected tensors named noise.0, noise.1, ... (one per step)");
  return noise;
}

}  // namespace diffuse::app
