#include "nn/activations.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>

#include "diffuse/errors.h"

namespace diffuse::nn {

Activation parse_activation(const std::string& name, const std::string& where) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "silu" || n == "swish") return Activation::kSilu;
  if (n == "mish") return Activation::kMish;
  if (n == "gelu") return Activation::kGelu;
  if (n == "relu") return Activation::kRelu;
  throw ConfigError(where + ": unknown activation '" + name +
                    "' (expected silu, swish, mish, gelu or relu)");
}

torch::Tensor apply_activation(const torch::Tensor& x, Activation act) {
  switch (act) {
    case Activation::kSilu:
      return torch::silu(x);
    case Activation::kMish:
      return torch::mish(x);
    case Activation::kGelu:
      return torch::gelu(x);
    case Activation::kRelu:
      return torch::relu(x);
  }
  return x;
}

}  // namespace diffuse::nn
