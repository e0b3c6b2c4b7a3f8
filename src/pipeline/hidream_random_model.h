// A full-size HiDream-I1 transformer with seeded random weights written to disk (17B
// parameters, ~34 GB in bf16), for measuring weight streaming and whole steps at real size on
// a machine that cannot hold it: `diffuse create-demo-model --arch hidream-i1`. It is filled
// one block at a time and written one shard at a time, so making it needs about one shard of
// memory (2 GiB shards: ~3 GiB peak), not 34 GB.
// Only the transformer is written (with model_index.json); text encoders and the VAE are not
// (~25 GB more), so the folder is for `diffuse bench hidream-stream`, not for generating.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace diffuse::pipeline {

struct RandomHiDreamOptions {
  uint64_t seed = 20261122;
  int64_t shard_bytes = int64_t{2} << 30;  // safetensors shards of about this size
  std::function<void(const std::string&)> log;
  nlohmann::json config;  // the transformer's config.json; null = HiDream-I1-Full's
};

// Writes DIR/model_index.json and DIR/transformer/{config.json, shards, index}, in bf16.
// InvalidArgument when the disk under DIR has less free space than the weights need (before writing
// anything). Returns the bytes of weights written.
int64_t create_random_hidream_i1(const std::string& dir, const RandomHiDreamOptions& options = {});

}  // namespace diffuse::pipeline
