// The accelerator flags of txt2img / img2img: for UNets --deepcache N[:LAYER:BLOCK],
// --deepcache-schedule, --tome RATIO, --tome-layers, --graph (CUDA); for DiTs --cache SPEC.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "diffuse/pipeline.h"

namespace diffuse::app {

struct AccelFlags {
  std::string deepcache;  // "N" or "N:LAYER:BLOCK"; empty = off
  std::string deepcache_schedule = "uniform";
  std::string tome;  // a ratio in [0, 1); empty = off
  std::vector<std::string> tome_layers;
  std::string tome_policy = "auto";  // auto: measured, left out where it does not pay; always
  std::string cache;                 // a DiT cache spec (accel/dit_cache.h); empty = off
  bool graph = false;                // CUDA graph replay of the UNet step
};

void add_accel_flags(CLI::App& app, AccelFlags& flags);
// Parses the flags into `config`; InvalidArgument naming the flag, the value and what is
// expected. (The layer and block ids are checked against the model once it is loaded.)
void apply_accel_flags(const AccelFlags& flags, GenerationConfig& config);
// Whether any UNet accelerator was asked for (HiDream runs none; --cache is the DiT's).
bool any_accel_flag(const AccelFlags& flags);

}  // namespace diffuse::app
