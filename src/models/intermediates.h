// Optional capture of a model's intermediate activations, keyed by diffusers module path
// ("down_blocks.0", "encoder.mid_block", ...), for golden comparisons and debugging.
#pragma once
#include <torch/types.h>

#include <map>
#include <string>

namespace diffuse::models {

using Intermediates = std::map<std::string, torch::Tensor>;

// Records `value` under `name` when capture is on (`sink` non-null); costs nothing otherwise.
inline void capture(Intermediates* sink, const std::string& name, const torch::Tensor& value) {
  if (sink) (*sink)[name] = value;
}

}  // namespace diffuse::models
