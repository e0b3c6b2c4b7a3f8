// Makes a full-size model folder (diffusers layout) with seeded random weights for a built-in
// architecture (bench/arch_configs.h: sd2.1-base, sd2.1, sd1.5) and a tokenizer vocabulary
// learned by this project's own BPE trainer, so loading and whole runs can be measured at real
// size without downloading a model. (The demo model that draws pictures is trained by
// train/demo_trainer.h.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::pipeline {

struct DemoModelOptions {
  uint64_t seed = 20261122;
  int num_merges = 1000;               // BPE merges learned from the built-in corpus
  bool half_precision_weights = true;  // store F16 to keep the folder small
  std::string arch;                    // required: sd2.1-base|sd2.1|sd1.5
};

// Prompts of the kind users write, that the demo tokenizers learn their vocabularies from.
const std::vector<std::string>& demo_prompt_corpus();

// Writes a complete diffusers folder into `dir` (created if needed; existing files replaced).
void create_demo_model(const std::string& dir, const DemoModelOptions& options = {});

}  // namespace diffuse::pipeline
