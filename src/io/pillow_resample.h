// Lanczos resampling of 8-bit images exactly as Pillow's Image.resize(size, Image.LANCZOS)
// computes it (libImaging/Resample.c): a separable filter of support 3 scaled by the
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

}  // namespace diffuse::io
