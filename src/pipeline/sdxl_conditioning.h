// Stable Diffusion XL's added conditioning, kept apart from the loop that uses it: what a
// folder's model_index.json says about it (base or refiner-style), and the UNet's time ids
// ("micro-conditioning") for one guidance branch, as diffusers' _get_add_time_ids makes them.
#pragma once
#include <string>
#include <vector>

#include "diffuse/pipeline.h"
#include "io/json_config.h"

namespace diffuse::models {
struct UNet2DConditionConfig;
}

namespace diffuse::pipeline {

struct SdxlOptions {
  // A generation without a negative prompt guides against zero embeddings (base models), not
  // against the encoded empty text (refiners).
  bool force_zeros_for_empty_prompt = true;
  // Refiner-style time ids: (orig h, orig w, crop top, crop left, aesthetic score).
  bool requires_aesthetics_score = false;
  // ConfigError naming the file when a key has the wrong type.
  static SdxlOptions from_model_index(const io::JsonConfig& index);
};

// The time ids of one branch for an image of height x width pixels: (orig h, orig w, crop top,
// crop left, target h, target w), or with aesthetics (orig h, orig w, crop top, crop left,
// score). Sizes left at 0 in `c` are the image's. The negative branch takes the positive crops
// (diffusers does the same, also where its own negative-crop argument exists).
std::vector<double> sdxl_time_ids(const SizeConditioning& c, const SdxlOptions& options, int height,
                                  int width, bool negative);

// ConfigError unless the UNet's added embedding takes what this folder makes: `ids` time ids
// of addition_time_embed_dim channels each plus the pooled text embedding of `pooled_width`
// (a base UNet behind a refiner's model_index.json fails here, not inside the UNet).
void check_sdxl_unet(const models::UNet2DConditionConfig& unet, const SdxlOptions& options,
                     int64_t pooled_width, const std::string& where);

// InvalidArgument naming the field for sizes outside [0, 16384] or non-finite scores.
void validate_size_conditioning(const SizeConditioning& c);

}  // namespace diffuse::pipeline
