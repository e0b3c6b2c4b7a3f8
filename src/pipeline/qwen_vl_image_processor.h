// Qwen2VLImageProcessor (transformers, the slow PIL path): an RGB image resized with Pillow to
// the nearest multiples of patch_size * merge_size inside [min_pixels, max_pixels]
// (smart_resize), rescaled, normalised, the frame repeated to temporal_patch_size, and cut into
// patches in the order of the vision tower's 2x2 merge windows. Read from the folder's
// preprocessor_config.json (Qwen-Image-Edit's processor/).
#pragma once
#include <torch/types.h>

#include <array>
#include <string>
#include <utility>

#include "io/pillow_resample.h"

namespace diffuse::pipeline {

struct QwenVLImageProcessorConfig {
  std::string source;  // the config file, for messages
  int64_t patch_size = 14;
  int64_t merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  bool do_resize = true, do_rescale = true, do_normalize = true;
  double rescale_factor = 1.0 / 255.0;
  std::array<float, 3> image_mean{0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> image_std{0.26862954f, 0.26130258f, 0.27577711f};
  io::PillowFilter resample = io::PillowFilter::kBicubic;

  // `dir`/preprocessor_config.json; IoError if absent, ConfigError naming the file and key for
  // values outside what the processor supports (a resample filter other than bicubic or
  // Lanczos, min_pixels > max_pixels, ...).
  static QwenVLImageProcessorConfig from_folder(const std::string& dir);
  int64_t factor() const { return patch_size * merge_size; }
};

// smart_resize: (height, width) rounded to multiples of `factor` (Python's round, half to
// even), scaled into [min_pixels, max_pixels] keeping the aspect ratio. InvalidArgument for an
// empty side or an aspect ratio above 200 (the reference refuses those too).
std::pair<int64_t, int64_t> qwen_smart_resize(int64_t height, int64_t width, int64_t factor,
                                              int64_t min_pixels, int64_t max_pixels);

struct QwenVLImageInput {
  torch::Tensor pixel_values;         // float32 [t * h * w, 3 * temporal * patch * patch]
  std::array<int64_t, 3> grid_thw{};  // patches along time, height, width
  int64_t merged_tokens(int64_t merge_size) const {
    return grid_thw[0] * grid_thw[1] * grid_thw[2] / (merge_size * merge_size);
  }
};

// image: uint8 [H, W, 3]. InvalidArgument naming the expected layout otherwise.
QwenVLImageInput qwen_vl_preprocess(const torch::Tensor& image_u8,
                                    const QwenVLImageProcessorConfig& config);

}  // namespace diffuse::pipeline
