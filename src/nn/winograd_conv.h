// Float32 3x3 convolutions on the CPU by Winograd's F(2x2, 3x3) algorithm: per 2x2 output tile
// 16 multiplications per channel pair instead of 36. The input and weight transforms turn the
// sum over input channels into 16 matrix products, which run through LibTorch's BLAS (OpenBLAS
// on Debian) at the matmul roofline's rate; the transforms themselves are memory passes
// (nn/kernels/winograd_impl.h).
//
// Why: on CPUs without native bf16 the float32 UNet step is 45-50 % convolution, and oneDNN's
// float32 direct convolutions run at 0.5-0.9x the matmul roofline there (the 8x8-16x16 levels
// worst). The result is the same convolution within float32 rounding; measured against a float64
// reference its error is lower than the direct convolution's (sums of C terms instead of 9C).
//
// Where it applies (winograd_conv_applies): float32 CPU inputs in NCHW, 3x3 kernels of stride
// 1, dilation 1, padding 1, one group, outside autograd, enough output tiles and channels for
// the matrix products to pay (measured: see the constants in winograd_conv.cpp), and not under
// the `math` attention policy, which is the reference path where every device runs LibTorch's
// own operators so that cpu and npu images compare bit for bit. DIFFUSE_WINOGRAD=0 turns it off
// (for comparisons).
#pragma once
#include <torch/types.h>

namespace diffuse::nn {

// Whether a convolution of `input` with `weight` [O, C, kh, kw] and these settings takes the
// Winograd path.
bool winograd_conv_applies(const torch::Tensor& input, const torch::Tensor& weight,
                           c10::IntArrayRef stride, c10::IntArrayRef padding,
                           c10::IntArrayRef dilation, int64_t groups);

// conv2d(input, weight, bias, stride 1, padding 1) by F(2x2, 3x3): input [B, C, H, W] float32
// contiguous on the CPU, weight [O, C, 3, 3] float32 (any strides), bias [O] float32 or
// undefined. Throws InvalidArgument on other inputs.
torch::Tensor winograd_conv3x3(const torch::Tensor& input, const torch::Tensor& weight,
                               const torch::Tensor& bias);

// Whether the Winograd path is on (DIFFUSE_WINOGRAD != 0 unless set here); for tests and
// side-by-side benchmarks.
bool winograd_enabled();
void set_winograd_enabled(bool enabled);

}  // namespace diffuse::nn
