#include "pipeline/sdxl_conditioning.h"

#include <cmath>

#include "diffuse/errors.h"
#include "models/unet2d_condition.h"

namespace diffuse::pipeline {

SdxlOptions SdxlOptions::from_model_index(const io::JsonConfig& index) {
  SdxlOptions o;
  o.force_zeros_for_empty_prompt =
      index.get<bool>("force_zeros_for_empty_prompt", o.force_zeros_for_empty_prompt);
  o.requires_aesthetics_score =
      index.get<bool>("requires_aesthetics_score", o.requires_aesthetics_score);
  return o;
}

std::vector<double> sdxl_time_ids(const SizeConditioning& c, const SdxlOptions& options, int height,
                                  int width, bool negative) {
  const auto or_image = [](int v, int image) { return static_cast<double>(v > 0 ? v : image); };
  std::vector<double> ids{or_image(c.original_height, height), or_image(c.original_width, width),
                          static_cast<double>(c.crop_top), static_cast<double>(c.crop_left)};
  if (options.requires_aesthetics_score) {
    ids.push_back(negative ? c.negative_aesthetic_score : c.aesthetic_score);
  } else {
    ids.push_back(or_image(c.target_height, height));
    ids.push_back(or_image(c.target_width, width));
  }
  return ids;
}

void check_sdxl_unet(const models::UNet2DConditionConfig& unet, const SdxlOptions& options,
                     int64_t pooled_width, const std::string& where) {
  const int64_t ids = options.requires_aesthetics_score ? 5 : 6;
  const int64_t made = ids * unet.addition_time_embed_dim + pooled_width;
  if (made == unet.projection_class_embeddings_input_dim) return;
  throw ConfigError(where + ": the UNet's projection_class_embeddings_input_dim is " +
                    std::to_string(unet.projection_class_embeddings_input_dim) + ", but " +
                    std::to_string(ids) + " time ids x addition_time_embed_dim " +
                    std::to_string(unet.addition_time_embed_dim) + " + the pooled text embedding " +
                    std::to_string(pooled_width) + " make " + std::to_string(made) +
                    " (model_index.json requires_aesthetics_score is " +
                    (options.requires_aesthetics_score ? "true" : "false") +
                    "; a refiner UNet needs true, a base UNet false)");
}

void validate_size_conditioning(const SizeConditioning& c) {
  constexpr int kMax = 16384;
  for (auto [v, name] : {std::pair{c.original_width, "original width"},
                         {c.original_height, "original height"},
                         {c.crop_top, "crop top"},
                         {c.crop_left, "crop left"},
                         {c.target_width, "target width"},
                         {c.target_height, "target height"}})
    if (v < 0 || v > kMax)
      throw InvalidArgument(std::string("size conditioning: ") + name + " must be in [0, " +
                            std::to_string(kMax) + "] pixels, got " + std::to_string(v));
  for (auto [v, name] : {std::pair{c.aesthetic_score, "aesthetic score"},
                         {c.negative_aesthetic_score, "negative aesthetic score"}})
    if (!std::isfinite(v) || std::abs(v) > 1000)
      throw InvalidArgument(std::string("size conditioning: ") + name +
                            " must be a finite number in [-1000, 1000], got " + std::to_string(v));
}

}  // namespace diffuse::pipeline
