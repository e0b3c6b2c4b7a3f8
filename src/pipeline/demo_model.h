// Makes the small demo model kept in the repository: a Stable-Diffusion-shaped pipeline folder
// (diffusers layout) with seeded random weights and a tokenizer vocabulary learned by this
// project's own BPE trainer. It exercises every stage end to end; it is not trained.
// With `arch` set to a built-in architecture (bench/arch_configs.h: sd2.1-base, sd2.1, sd1.5)
// the folder has that model's real configs and sizes instead, so loading and whole runs can
// be measured at full size without downloading a model.
#pragma once
#include <cstdint>
#include <string>

namespace diffuse::pipeline {

struct DemoModelOptions {
  uint64_t seed = 20261122;
  int num_merges = 1000;               // BPE merges learned from the built-in corpus
  bool half_precision_weights = true;  // store F16 to keep the folder small
  std::string arch;                    // empty: the small demo model
};

// Writes a complete diffusers folder into `dir` (created if needed; existing files replaced).
void create_demo_model(const std::string& dir, const DemoModelOptions& options = {});

}  // namespace diffuse::pipeline
