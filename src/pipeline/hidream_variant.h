// The HiDream variants and the defaults their reference scripts run with, so that a user who
// only names the model folder gets what its authors intended:
//   i1-full  50 steps, guidance 5.0 (UniPC flow scheduler)
//   i1-dev   28 steps, guidance 0 (FlashFlowMatchEuler, shift 6.0)
//   i1-fast  16 steps, guidance 0 (FlashFlowMatchEuler, shift 3.0)
//   e1       28 steps, guidance 5.0, image guidance 4.0, refine 0.3 (E1-Full: I1 + LoRA)
//   e1.1     28 steps, guidance 3.0, image guidance 1.5
// "auto" reads the folder: a model made here (the trained demo) keeps the settings it is tuned
// for in model_index.json's "_diffuse_defaults" {steps, guidance_scale, image_guidance_scale,
// max_sequence_length}; otherwise an editing pipeline is e1; otherwise the scheduler tells Full
// (UniPC or another solver) from Dev/Fast (FlashFlowMatchEuler, shift 6 / 3). E1.1 cannot be
// told from E1 by its files: name it.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "io/model_folder.h"

namespace diffuse::pipeline {

struct HiDreamDefaults {
  std::string variant;
  int steps = 28;
  double guidance_scale = 5.0;
  double image_guidance_scale = 4.0;
  double refine_strength = 0.0;  // with the E1-Full LoRA; plain E1 weights have no refine
};

// The prompt length (tokens per text encoder) the folder's model runs with: "_diffuse_defaults"
// .max_sequence_length of model_index.json, else the HiDream pipelines' 128. ConfigError for a
// value outside [1, 4096].
int64_t hidream_max_sequence_length(const io::ModelFolder& folder);

// The DiT cache settings the folder's model is measured with, by method name:
// "_diffuse_defaults".cache of model_index.json ({"fbcache": "fbcache:0.25", ...}), empty when
// it has none. ConfigError naming the key for a value that is not a cache spec of that method.
std::map<std::string, std::string> dit_cache_defaults(const io::ModelFolder& folder);
// A --cache spec with the folder's default for a bare method name ("fbcache" ->
// "fbcache:0.25" where the folder says so); any other spec as given.
std::string dit_cache_spec(const io::ModelFolder& folder, const std::string& spec);

// InvalidArgument naming the accepted names for an unknown variant.
HiDreamDefaults hidream_defaults(const io::ModelFolder& folder,
                                 const std::string& variant = "auto");
std::vector<std::string> hidream_variant_names();  // "auto", then the variants

// model_index.json names HiDream-E1's pipeline (HiDreamImageEditingPipeline): the folder's own
// transformer edits. An I1 folder edits only with E1 weights given (an E1 transformer or LoRA).
bool is_hidream_editing_folder(const io::ModelFolder& folder);

}  // namespace diffuse::pipeline
