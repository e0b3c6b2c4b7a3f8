// Float32 3x3 convolutions on the CPU by Winograd's minimal filtering: F(2x2, 3x3) takes 16
// multiplications per 2x2 output tile and channel pair instead of 36, F(4x4, 3x3) 36 per 4x4
// tile instead of 144. The input and weight transforms turn the sum over input channels into
// 16 or 36 matrix products, which run through LibTorch's BLAS (OpenBLAS on Debian) at the
// matmul roofline's rate; the transforms themselves are memory passes
// (nn/kernels/winograd_impl.h).
//
// Why: on CPUs without native bf16 the float32 UNet step is 45-50 % convolution and the VAE
// decode nearly all, and oneDNN's float32 direct convolutions run at 0.5-0.9x the matmul
// roofline there. Accuracy against a float64 reference: F(2x2) is as accurate as the direct
// convolution or more (sums of C terms instead of 9C), F(4x4) ~6x less accurate than the
// direct one (its transforms' coefficients up to 8 and 1/24), i.e. ~1e-5 of the output's
// scale: far below bf16's rounding, which the auto policy uses wherever the CPU has it.
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

// conv2d(input, weight, bias, stride 1, padding 1) by F(m x m, 3x3) with m = `tile_size`, 2
// or 4 (0: 4 where the images have enough 4x4 tiles, else 2): input [B, C, H, W] float32
// contiguous on the CPU, weight [O, C, 3, 3] of any floating dtype (a 16-bit one is widened for
// the call) and strides, bias [O] or undefined.
// Throws InvalidArgument on other inputs.
torch::Tensor winograd_conv3x3(const torch::Tensor& input, const torch::Tensor& weight,
                               const torch::Tensor& bias, int64_t tile_size = 0);

// Whether the Winograd path is on (DIFFUSE_WINOGRAD != 0 unless set here); for tests and
// side-by-side benchmarks.
bool winograd_enabled();
void set_winograd_enabled(bool enabled);

}  // namespace diffuse::nn
