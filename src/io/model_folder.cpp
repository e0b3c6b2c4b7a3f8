#include "io/model_folder.h"
#include "io/input_file.h"

#include <filesystem>
#include <set>

#include "diffuse/errors.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/string_affixes.h"

namespace fs = std::filesystem;

namespace diffuse::io {

ModelFolder ModelFolder::open(const std::string& dir) {
  if (!fs::is_directory(dir))
    throw IoError("model folder '" + dir + "' does not exist or is not a folder");
  std::string index = (fs::path(dir) / "model_index.json").string();
  if (!fs::exists(index))
    throw IoError("'" + dir + "' is not a diffusers pipeline folder: model_index.json is missing");
  ModelFolder folder;
  folder.dir_ = dir;
  folder.model_index_ = JsonConfig::load(index);
  return folder;
}

std::string ModelFolder::component_class(const std::string& component) const {
  const auto& j = model_index_.json();
  if (!j.contains(component) || !j[component].is_array() || j[component].size() != 2 ||
      !j[component][1].is_string())
    return "";
  return j[component][1].get<std::string>();
}

std::string ModelFolder::component_dir(const std::string& component) const {
  return (fs::path(dir_) / component).string();
}

bool ModelFolder::has_component(const std::string& component) const {
  return fs::is_directory(component_dir(component));
}

JsonConfig ModelFolder::component_config(const std::string& component,
                                         const std::string& file_name) const {
  std::string path = (fs::path(component_dir(component)) / file_name).string();
  if (!fs::exists(path))
    throw IoError("model folder '" + dir_ + "': " + component + "/" + file_name + " is missing");
  return JsonConfig::load(path);
}

void ModelFolder::set_component_weights_file(const std::string& component,
                                             const std::string& path) {
  if (!fs::is_regular_file(path))
    throw IoError("weights file '" + path + "' for " + component + " does not exist");
  if (!ends_with(path, ".safetensors") && !ends_with(path, ".gguf"))
    throw IoError("weights file '" + path + "' for " + component +
                  ": expected a *.safetensors or *.gguf file");
  weights_files_[component] = path;
}

std::map<std::string, torch::Tensor> ModelFolder::component_weights(
    const std::string& component) const {
  return load_weights_file(component_weights_path(component));
}

std::string ModelFolder::component_weights_path(const std::string& component) const {
  if (auto it = weights_files_.find(component); it != weights_files_.end()) return it->second;
  fs::path cdir = component_dir(component);
  if (!fs::is_directory(cdir))
    throw IoError("model folder '" + dir_ + "': component folder '" + component + "' is missing");
  // Preference order follows diffusers: the canonical names first, then any single file.
  for (const char* name :
       {"diffusion_pytorch_model.safetensors", "model.safetensors",
        "diffusion_pytorch_model.safetensors.index.json", "model.safetensors.index.json",
        "diffusion_pytorch_model.gguf", "model.gguf"}) {
    if (fs::exists(cdir / name)) return (cdir / name).string();
  }
  // Any single weights file: a GGUF with diffusers names (city96's quantized transformers).
  std::vector<fs::path> candidates;
  for (const auto& e : fs::directory_iterator(cdir)) {
    const auto p = e.path().string();
    if (ends_with(p, ".safetensors") || ends_with(p, ".gguf")) candidates.push_back(e.path());
  }
  if (candidates.size() == 1) return candidates[0].string();
  if (candidates.empty())
    throw IoError("model folder '" + dir_ + "': no *.safetensors or *.gguf weights in '" +
                  component +
                  "/' (.bin/.ckpt pickles are not supported; convert them to safetensors)");
  throw IoError("model folder '" + dir_ + "': several weight files in '" + component +
                "/' and no index.json saying which to use");
}

std::map<std::string, torch::Tensor> load_weights_file(const std::string& path) {
  const std::string suffix = ".index.json";
  if (path.size() > suffix.size() &&
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    JsonConfig index = JsonConfig::load(path);
    if (!index.has("weight_map") || !index.json()["weight_map"].is_object())
      throw FormatError(path + ": missing object 'weight_map'");
    std::set<std::string> shards;
    for (auto it = index.json()["weight_map"].begin(); it != index.json()["weight_map"].end();
         ++it) {
      if (!it.value().is_string())
        throw FormatError(path + ": weight_map['" + it.key() + "'] is not a file name");
      require_inside_folder(it.value().get<std::string>(), path,
                            "weight_map['" + it.key() + "'] shard");
      shards.insert(it.value().get<std::string>());
    }
    std::map<std::string, torch::Tensor> out;
    for (const auto& shard : shards) {
      auto shard_path = (fs::path(path).parent_path() / shard).string();
      auto file = SafetensorsFile::open(shard_path);
      for (auto& [k, v] : file->load_all()) out.emplace(k, v);
    }
    for (auto it = index.json()["weight_map"].begin(); it != index.json()["weight_map"].end(); ++it)
      if (!out.count(it.key()))
        throw FormatError(path + ": tensor '" + it.key() + "' is not in shard '" +
                          it.value().get<std::string>() + "'");
    return out;
  }
  if (ends_with(path, ".gguf")) {
    // Quantized tensors dequantized to float32, the others in their own dtype.
    const auto file = GgufFile::open(path);
    std::map<std::string, torch::Tensor> out;
    for (const auto& name : file->names()) out.emplace(name, file->get(name));
    return out;
  }
  return SafetensorsFile::open(path)->load_all();
}

std::string use_transformer_weights(ModelFolder& folder, const std::string& transformer) {
  const auto ext = fs::path(transformer).extension();
  if (ext != ".gguf" && ext != ".safetensors") return transformer;
  folder.set_component_weights_file("transformer", transformer);
  return "transformer";
}

}  // namespace diffuse::io
