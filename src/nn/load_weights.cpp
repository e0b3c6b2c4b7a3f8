#include "nn/load_weights.h"

#include <torch/torch.h>

#include <sstream>

#include "diffuse/errors.h"
#include "io/safetensors.h"

namespace diffuse::nn {
LoadReport load_state_dict(torch::nn::Module& module,
                           const std::map<std::string, torch::Tensor>& weights,
                           const std::string& source, const std::set<std::string>& ignored) {
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  std::vector<std::string> missing;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    auto it = weights.find(item.key());
    if (it == weights.end()) {
      missing.push_back(item.key());
      continue;
    }
    auto& param = item.value();
    if (param.sizes() != it->second.sizes())
      throw FormatError(source + ": tensor '" + item.key() + "' has shape " +
                        c10::str(it->second.sizes()) + ", the model expects " +
                        c10::str(param.sizes()));
    param.copy_(it->second);
    io::release_mapped_pages(it->second);  // the file's pages, now copied, leave the RSS
    used.insert(item.key());
  }
  for (auto& item : module.named_buffers(/*recurse=*/true)) {
    auto it = weights.find(item.key());
    if (it == weights.end()) continue;
    if (item.value().sizes() != it->second.sizes())
      throw FormatError(source + ": buffer '" + item.key() + "' has shape " +
                        c10::str(it->second.sizes()) + ", the model expects " +
                        c10::str(item.value().sizes()));
    item.value().copy_(it->second);
    used.insert(item.key());
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += ", ... (" + std::to_string(missing.size()) + " in all)";
    throw FormatError(source + ": missing weights for the model's parameters: " + list +
                      " (is this the right model type / config?)");
  }
  LoadReport report;
  for (const auto& kv : weights)
    if (!used.count(kv.first) && !ignored.count(kv.first)) report.unexpected.insert(kv.first);
  return report;
}

}  // namespace diffuse::nn
