// Shared steps of loading one component of a diffusers folder into a module.
#pragma once
#include <torch/nn/module.h>

#include <set>
#include <string>

#include "io/json_config.h"
#include "io/model_folder.h"

namespace diffuse::models {

// `<component>/config.json`; ConfigError if its _class_name is present and not `expected_class`.
io::JsonConfig component_config(const io::ModelFolder& folder, const std::string& component,
                                const std::string& expected_class);

// Loads the component's weights into `module` by name. FormatError naming the folder if a
// parameter is missing or mis-shaped, or if the file has tensors the module does not know
// (a config that does not match its weights would otherwise run with pieces left out).
// `ignored`: keys the file may hold that the module deliberately lacks (tied aliases, an
// unused lm_head).
// `share_mapped`: parameters view the mapped files instead of copies (nn::load_state_dict).
void load_component_weights(torch::nn::Module& module, const io::ModelFolder& folder,
                            const std::string& component, const std::set<std::string>& ignored = {},
                            bool share_mapped = false);

}  // namespace diffuse::models
