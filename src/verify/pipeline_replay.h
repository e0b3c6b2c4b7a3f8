// Replays a golden pipeline case through the engine (same prompts, scheduler config, initial
// latents or recorded noise) and returns every traced intermediate. verify_pipeline compares
// them with the reference; the npu-sim tests compare two devices with each other.
#pragma once
#include <torch/types.h>

#include <map>
#include <string>

#include "diffuse/pipeline.h"
#include "verify/golden.h"

namespace diffuse::verify {

struct PipelineReplay {
  std::map<std::string, torch::Tensor> traced;  // CPU copies, by trace name
  GenerationResult result;
  bool all_noise_used = true;  // img2img: every supplied noise tensor was drawn
};

// `model_path` is the set's diffusers folder or its single-file checkpoint; `options` picks
// device, dtypes and attention (config_dir is filled in for single-file checkpoints).
PipelineReplay replay_pipeline_case(const GoldenSet& set, const GoldenCase& c,
                                    const std::string& model_path, LoadOptions options);

}  // namespace diffuse::verify
