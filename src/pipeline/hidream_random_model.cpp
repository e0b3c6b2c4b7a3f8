#include "pipeline/hidream_random_model.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "models/builtin_configs.h"
#include "models/hidream_transformer.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "pipeline/memory_estimate.h"
#include "pipeline/real_size_model.h"

namespace fs = std::filesystem;

namespace diffuse::pipeline {

int64_t create_random_hidream_i1(const std::string& dir, const RandomHiDreamOptions& o) {
  auto log = [&](const std::string& s) {
    if (o.log) o.log(s);
  };
  const auto config_json = o.config.is_null() ? models::hidream_i1_transformer_config() : o.config;
  const auto config =
      models::HiDreamTransformerConfig::from_json(io::JsonConfig(config_json, "hidream-i1"));
  torch::InferenceMode guard;
  // Built without initialisation: nothing is touched (resident) until a block is filled.
  models::HiDreamImageTransformer2DModel model{nullptr};
  {
    nn::SkipInitGuard skip(torch::kBFloat16);
    model = models::HiDreamImageTransformer2DModel(config);
  }
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel() * 2;  // bf16
  fs::create_directories(fs::path(dir) / "transformer");
  const auto space = fs::space(dir);
  if (static_cast<int64_t>(space.available) < total + (int64_t{1} << 30))
    throw InvalidArgument("create-demo-model --arch hidream-i1: the weights need " +
                          format_gib(total) + " (+1 GiB headroom) in '" + dir + "', the disk has " +
                          format_gib(static_cast<int64_t>(space.available)) + " free");
  log("writing a random HiDream-I1 transformer (" + format_gib(total) + " in bf16) to " + dir);
  RandomFolderOptions w;
  w.seed = o.seed;
  w.weights = "bf16";
  w.shard_bytes = o.shard_bytes;
  w.log = o.log;
  const int64_t written = write_random_component(dir, "transformer", "hidream", config_json, w);
  std::ofstream(fs::path(dir) / "model_index.json") << nlohmann::json{
      {"_class_name", "HiDreamImagePipeline"},
      {"_diffusers_version", "0.33.0"},
      {"transformer",
       {"diffusers", "HiDreamImageTransformer2DModel"}}}.dump(2);
  return written;
}

}  // namespace diffuse::pipeline
