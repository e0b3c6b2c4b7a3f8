#include "models/load_component.h"

#include <torch/torch.h>

#include "diffuse/errors.h"
#include "nn/load_weights.h"

namespace diffuse::models {

io::JsonConfig component_config(const io::ModelFolder& folder, const std::string& component,
                                const std::string& expected_class) {
  auto cfg = folder.component_config(component);
  auto cls = cfg.get<std::string>("_class_name", expected_class);
  if (cls != expected_class)
    cfg.fail("_class_name", "expected \"" + expected_class + "\", got \"" + cls + "\"");
  return cfg;
}

void load_component_weights(torch::nn::Module& module, const io::ModelFolder& folder,
                            const std::string& component, const std::set<std::string>& ignored,
                            bool share_mapped) {
  const std::string source = folder.component_dir(component);
  auto report = nn::load_state_dict(module, folder.component_weights(component), source, ignored,
                                    share_mapped);
  if (report.unexpected.empty()) return;
  std::string list;
  size_t shown = 0;
  for (const auto& name : report.unexpected) {
    if (shown++ == 5) break;
    list += (list.empty() ? "" : ", ") + name;
  }
  if (report.unexpected.size() > 5)
    list += ", ... (" + std::to_string(report.unexpected.size()) + " in all)";
  throw FormatError(source +
                    ": the weights have tensors the model built from config.json does not have: " +
                    list + " (does config.json match the weights?)");
}

}  // namespace diffuse::models
