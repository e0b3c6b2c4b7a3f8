// A diffusers pipeline folder: model_index.json plus one sub-folder per component with its
// config.json and weights (*.safetensors, or sharded via *.safetensors.index.json).
#pragma once
#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace diffuse::io {

class ModelFolder {
 public:
  // Throws IoError if `dir` or its model_index.json is missing, FormatError if malformed.
  static ModelFolder open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const JsonConfig& model_index() const { return model_index_; }
  // The class name model_index.json gives a component ("UNet2DConditionModel"), or "" if absent.
  std::string component_class(const std::string& component) const;
  std::string component_dir(const std::string& component) const;
  bool has_component(const std::string& component) const;

  // `<component>/<file_name>` parsed; IoError naming the path if missing.
  JsonConfig component_config(const std::string& component,
                              const std::string& file_name = "config.json") const;
  // All weights of a component, from its single safetensors file, its sharded index or a GGUF.
  std::map<std::string, torch::Tensor> component_weights(const std::string& component) const;
  // The file component_weights reads (a safetensors file, a shard index or a GGUF).
  std::string component_weights_path(const std::string& component) const;
  // Takes `component`'s weights from `path` (a *.safetensors or *.gguf file, e.g. a quantized
  // transformer) instead of its folder's; its config.json still comes from the folder. IoError
  // if the file does not exist.
  void set_component_weights_file(const std::string& component, const std::string& path);

 private:
  std::string dir_;
  JsonConfig model_index_;
  std::map<std::string, std::string> weights_files_;  // set_component_weights_file
};

// What --transformer names: a component folder of `folder` ("transformer", or HiDream-E1's
// "transformer_e1"), returned as it is; or a *.gguf / *.safetensors weights file (diffusers
// names, or a mapping table's, e.g. BFL's FLUX names), which becomes the "transformer"
// component's weights (its config.json still from the folder) and "transformer" is returned.
// IoError if such a file does not exist.
std::string use_transformer_weights(ModelFolder& folder, const std::string& transformer);

// Loads every tensor from a safetensors file, from the shards an *.index.json names, or from a
// GGUF file (*.gguf: quantized tensors dequantized to float32).
std::map<std::string, torch::Tensor> load_weights_file(const std::string& path);

}  // namespace diffuse::io
