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

  // Units written in order: every top-level module, then each block; a unit is filled with
  // random values, saved into the current shard and freed again.
  std::vector<std::pair<std::string, torch::nn::Module*>> units;
  for (const auto& c : model->named_children()) {
    if (c.key() == "double_stream_blocks" || c.key() == "single_stream_blocks") continue;
    units.emplace_back(c.key() + ".", c.value().get());
  }
  for (const auto& list : {"double_stream_blocks", "single_stream_blocks"})
    for (const auto& c : model->named_children()[list]->named_children())
      units.emplace_back(std::string(list) + "." + c.key() + ".", c.value().get());

  // The shard count, for the file names: the same grouping as below, on sizes alone.
  int64_t shards = 0;
  {
    int64_t size = 0;
    for (const auto& unit : units) {
      for (const auto& p : unit.second->parameters()) size += p.numel() * 2;
      if (size >= o.shard_bytes) ++shards, size = 0;
    }
    if (size > 0) ++shards;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<std::pair<std::string, torch::Tensor>> shard;
  int64_t shard_size = 0, written = 0;
  int shard_index = 0;
  std::vector<torch::Tensor> written_params;  // freed once their shard is on disk
  auto flush = [&] {
    if (shard.empty()) return;
    char name[96];
    std::snprintf(name, sizeof name, "diffusion_pytorch_model-%05d-of-%05lld.safetensors",
                  ++shard_index, static_cast<long long>(shards));
    for (const auto& [key, t] : shard) weight_map[key] = name;
    io::save_safetensors((fs::path(dir) / "transformer" / name).string(), shard);
    written += shard_size;
    log("  " + std::string(name) + " (" + format_gib(written) + " of " + format_gib(total) + ")");
    shard.clear();
    shard_size = 0;
    for (auto& p : written_params) p.set_data(torch::empty({0}, p.options()));
    written_params.clear();
  };
  uint64_t seed = o.seed;
  for (auto& [prefix, module] : units) {
    nn::init_pooled_random_weights(*module, seed++);
    for (const auto& p : module->named_parameters()) {
      // bf16 throughout (norm layers are built in float32): the whole file streams zero-copy.
      shard.emplace_back(prefix + p.key(), p.value().to(torch::kBFloat16));
      shard_size += static_cast<int64_t>(shard.back().second.nbytes());
      written_params.push_back(p.value());
    }
    if (shard_size >= o.shard_bytes) flush();
  }
  flush();
  std::ofstream(fs::path(dir) / "transformer" / "diffusion_pytorch_model.safetensors.index.json")
      << nlohmann::json{{"metadata", {{"total_size", written}}}, {"weight_map", weight_map}}.dump(
             1);
  std::ofstream(fs::path(dir) / "transformer" / "config.json") << config_json.dump(2);
  std::ofstream(fs::path(dir) / "model_index.json") << nlohmann::json{
      {"_class_name", "HiDreamImagePipeline"},
      {"_diffusers_version", "0.33.0"},
      {"transformer",
       {"diffusers", "HiDreamImageTransformer2DModel"}}}.dump(2);
  return written;
}

}  // namespace diffuse::pipeline
