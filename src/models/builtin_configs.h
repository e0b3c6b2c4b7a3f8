// Built-in model architectures for benchmarks: the real diffusers config.json files of
// Stable Diffusion 2.1-base, 2.1 (768-v) and 1.5, and a tiny one for smoke tests. The bench
// builds models from these with random weights, so it runs at real sizes without downloads.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace diffuse::bench {

struct ArchConfigs {
  std::string name;
  std::string description;
  nlohmann::json unet, vae, text_encoder, scheduler;
};

// "sd2.1-base", "sd2.1", "sd1.5", "tiny"; InvalidArgument listing the names otherwise.
const ArchConfigs& builtin_arch(const std::string& name);
std::vector<std::string> builtin_arch_names();

}  // namespace diffuse::bench
