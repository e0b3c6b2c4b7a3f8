// Resampling of 8-bit images exactly as Pillow's Image.resize(size, Image.LANCZOS / BICUBIC)
// computes it (libImaging/Resample.c): a separable filter (Lanczos: support 3; bicubic with
// a = -0.5: support 2, what Qwen2-VL's image processor uses) scaled by the
// downscaling factor, coefficients normalised per output pixel and rounded to 22-bit fixed
// point, a horizontal pass over the rows the vertical pass needs (clamped to 8 bits), then
// the vertical pass. The diffusers pipelines resize PIL images this way (VaeImageProcessor's
// default resample "lanczos"), so matching it bit for bit keeps an edit's source identical.
#pragma once
#include <torch/types.h>

namespace diffuse::io {

// image uint8 [H, W, C] (any channel count) -> uint8 [out_h, out_w, C]. InvalidArgument for
// another dtype or layout, or a size outside 1..65536.
torch::Tensor pillow_lanczos_resize(const torch::Tensor& image, int64_t out_h, int64_t out_w);

enum class PillowFilter { kLanczos, kBicubic };
// The same with either filter.
torch::Tensor pillow_resize(const torch::Tensor& image, int64_t out_h, int64_t out_w,
                            PillowFilter filter);

}  // namespace diffuse::io
