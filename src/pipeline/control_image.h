// A ControlNet's conditioning image as diffusers' control_image_processor makes it
// (VaeImageProcessor(do_convert_rgb=True, do_normalize=False)): resized to the generation's
// size, RGB in [0, 1], not normalised to [-1, 1].
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace diffuse::pipeline {

// uint8 [H, W, 3] (as a PIL image) -> float32 [1, 3, height, width]: Pillow's Lanczos resize
// when the size differs, then /255. A float32 [1, H, W, 3] or [H, W, 3] array in [0, 1] (a
// numpy input) is resized with torch's 'nearest' instead. InvalidArgument for other layouts.
torch::Tensor preprocess_control_image(const torch::Tensor& image, int64_t height, int64_t width);

}  // namespace diffuse::pipeline

namespace diffuse::pipeline {

// A control-image preprocessor by name: "" or "none" (the image as given), "canny" or
// "canny:LOW:HIGH" (OpenCV's Canny edge detector on the RGB image, thresholds 100 and 200 by
// default, as the diffusers ControlNet examples run it; white edges on black, 3 channels).
// uint8 [H, W, 3] -> uint8 [H, W, 3]. InvalidArgument for an unknown name or bad thresholds;
// Unsupported when this build has no OpenCV.
torch::Tensor apply_control_preprocessor(const torch::Tensor& image, const std::string& spec);
// Checks a spec without running it (the same errors as above).
void validate_control_preprocessor(const std::string& spec);

}  // namespace diffuse::pipeline
