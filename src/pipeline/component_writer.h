// Writes the pieces of a diffusers-layout model folder that this project makes itself (the
// trained demo model, full-size random benchmark models): config files and weights.
#pragma once
#include <torch/nn/module.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace diffuse::pipeline {

// Writes `j` (pretty-printed) to `path` atomically, creating its folder.
void write_json_file(const std::filesystem::path& path, const nlohmann::ordered_json& j);

// model_index.json of a Stable Diffusion pipeline folder made here; `note` says how it was made.
nlohmann::ordered_json stable_diffusion_model_index(const std::string& scheduler_class,
                                                    const std::string& note);

// Saves every parameter of `module` under its diffusers name, as F16 when `half`.
void save_module_weights(torch::nn::Module& module, const std::filesystem::path& path, bool half,
                         const std::string& made_by);

}  // namespace diffuse::pipeline
