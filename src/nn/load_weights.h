// Copies a state dict into a module's registered parameters and buffers, by name.
#pragma once
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <set>
#include <string>

namespace diffuse::nn {

struct LoadReport {
  std::set<std::string> unexpected;  // keys in the file that the module does not have
};

// Whether every value of `t` is finite, checked in slices so that no tensor-sized mask is
// made (those piled up in the heap while loading).
bool all_finite(const torch::Tensor& t);

// Every parameter of `module` must be present with the right shape (FormatError naming
// `source`, the key and both shapes otherwise). Buffers are loaded when present. Keys that the
// module does not know are returned in the report, except those in `ignored` (e.g.
// text_model.embeddings.position_ids); a parameter named in `ignored` may be absent (loaded
// otherwise, e.g. kept quantized). A NaN/Inf in a loaded value is a FormatError naming the
// tensor (in the file, or from an overflowing dtype conversion). Values are converted to the
// parameter's dtype/device;
// the pages of weights that view a mapped safetensors file are released once copied.
// `share_mapped`: parameters whose file tensor lies in a file mapping view it instead (in the
// file's dtype, nothing copied; models::BlockWeightStream places them as they run).
// `keep_16bit`: parameters named here whose file tensor is float16/bfloat16 while the parameter
// is float32 take a copy in the file's dtype instead (half the memory; nn::Linear and
// nn::Conv2d widen such a weight per call, exactly, see nn::layer_weight_names).
// `copied`: called with each file tensor once its values are in the module (a GGUF's loader gives
// the tensor's pages back there, as is done for safetensors mappings).
LoadReport load_state_dict(torch::nn::Module& module,
                           const std::map<std::string, torch::Tensor>& weights,
                           const std::string& source, const std::set<std::string>& ignored = {},
                           bool share_mapped = false, const std::set<std::string>& keep_16bit = {},
                           const std::function<void(const torch::Tensor&)>& copied = {});

}  // namespace diffuse::nn
