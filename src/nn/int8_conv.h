// A convolution whose weight is kept as int8 rows (`--weights int8`: quant::GgmlType::I8_ROWS,
// the [out, in * kh * kw] matrix) multiplied in 8-bit integers on the CPU, as nn/int8_linear.h
// multiplies a linear layer: each output pixel's receptive field (its im2col row, in the
// weight's (channel, ky, kx) order) is quantized on the fly to unsigned codes with its own scale
// (max |x| / 127), oneDNN's integer GEMM sums the code products exactly in int32 (VPDPBUSD on
// AVX512-VNNI: twice the products per instruction of VDPBF16PS), and one pass scales each sum
// by its pixel's and its output channel's scale and adds the bias. The output is written in
// channels-last order, which is the GEMM's [pixels, channels] result as it stands.
//
// The error bound is the linear layer's with the im2col row as input: per output
// sum_k (|x_k| sw/2 + |w_k| sx/2 + sx sw/4). Where this does not run, or where it would be the
// slower product (int8_conv2d_chosen), the layer dequantizes its weight and convolves as usual.
#pragma once
#include <torch/types.h>

#include "quant/quantized_weight.h"

namespace diffuse::nn {

// What a 2-D convolution does besides its weight.
struct ConvGeometry {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;  // zeros
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

// Whether int8_conv2d runs `input` ([N, C, H, W], float32 or bf16, on the CPU, no gradient)
// with `w`: an I8_ROWS weight of C * kernel_h * kernel_w columns on the CPU, one group, no
// dilation, and int8_gemm_available().
bool int8_conv2d_runs(const torch::Tensor& input, const quant::QuantizedWeight& w,
                      const ConvGeometry& g);
// Whether a layer takes int8_conv2d: it runs, and is the faster product here (not for bf16
// inputs on CPUs with AMX, whose bf16 convolutions in oneDNN outrun the VNNI integer GEMM; see
// int8_linear_chosen).
bool int8_conv2d_chosen(const torch::Tensor& input, const quant::QuantizedWeight& w,
                        const ConvGeometry& g);
// conv2d(input, dequantized(w), bias) as above, in the input's dtype, channels-last. bias:
// [out] or undefined. Needs int8_conv2d_runs; InvalidArgument otherwise.
torch::Tensor int8_conv2d(const torch::Tensor& input, const quant::QuantizedWeight& w,
                          const ConvGeometry& g, const torch::Tensor& bias);

}  // namespace diffuse::nn
