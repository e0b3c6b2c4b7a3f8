// Fused bf16 elementwise kernels for the CPU: normalisations with float32 statistics, SiLU
// and GEGLU, reading and writing bf16 once (GEGLU also on float32). LibTorch 1.13's own bf16
// group_norm/layer_norm on the CPU keep intermediate values in bf16 (errors of several bf16 ulps,
// up to 0.4 for LayerNorm rows with a mean of 10); these keep every statistic and intermediate in
// float32 and round once on output.
//
// Plain C++ interface, one implementation per instruction set (cpu_kernels_impl.h), chosen
// at run time by nn/fused_ops.cpp; see flash_kernel.h for why these units stay torch-free.
#pragma once
#include <cstdint>

namespace diffuse::nn::kernels {

// The three transforms of a Winograd convolution (winograd_impl.h), one signature per step for
// both tile sizes.
using WinogradWeights = void (*)(const float* w, int64_t o0, int64_t o1, int64_t C, float* U,
                                 int64_t plane, float* scratch);
using WinogradInput = void (*)(const float* x, int64_t c0, int64_t c1, int64_t H, int64_t W,
                               int64_t ty0, int64_t ty1, float* V, int64_t plane, int64_t ld,
                               int64_t t0, float* scratch);
using WinogradOutput = void (*)(const float* M, int64_t o0, int64_t o1, int64_t plane, int64_t ld,
                                int64_t t0, const float* bias, int64_t H, int64_t W, int64_t ty0,
                                int64_t ty1, float* y, float* scratch);

struct CpuKernels {
  const char* name;
  // Mean and (biased) variance of n bf16 values, accumulated in float32 blocks and double.
  void (*bf16_moments)(const uint16_t* x, int64_t n, double* mean, double* var);
  // y = x * scale + shift, then SiLU if `silu`; n values, bf16 in and out.
  void (*bf16_scale_shift)(const uint16_t* x, int64_t n, float scale, float shift, bool silu,
                           uint16_t* y);
  // One LayerNorm row of d values: (x - mean) / sqrt(var + eps) * w + b (w, b may be null).
  void (*bf16_layer_norm_row)(const uint16_t* x, int64_t d, const float* w, const float* b,
                              float eps, uint16_t* y);
  // y = (a + a_bias) * gelu(g + g_bias) with the exact (erf) GELU; n values; the float32
  // biases may be null (zero).
  void (*bf16_geglu)(const uint16_t* a, const uint16_t* g, int64_t n, const float* a_bias,
                     const float* g_bias, uint16_t* y);
  // The same on float32 values: one pass where LibTorch's float32 ops take four (bias add,
  // chunk, gelu, product), each into a fresh tensor.
  void (*f32_geglu)(const float* a, const float* g, int64_t n, const float* a_bias,
                    const float* g_bias, float* y);
  // y = y + bias + residual over n values, summed in float32 and rounded once; the float32
  // bias may be null (zero).
  void (*bf16_add_bias_residual)(uint16_t* y, const float* bias, const uint16_t* residual,
                                 int64_t n);

  // Int8 linear layers (nn/int8_linear.h). One row of n values to unsigned codes
  // q = round(x / s) + 128 in [1, 255] (half to even), s = max|x| / 127; returns s (0, every code
  // 128, for a row of zeros; NaN, codes unspecified, for a row holding NaN or infinity).
  float (*bf16_quantize_row_u8)(const uint16_t* x, int64_t n, uint8_t* q);
  float (*f32_quantize_row_u8)(const float* x, int64_t n, uint8_t* q);
  // y[j] = acc[j] * (sx * sw[j]) + bias[j] + residual[j] for n values, in float32 and rounded
  // once (bias, residual may be null).
  void (*bf16_int8_dequantize_row)(const int32_t* acc, int64_t n, float sx, const float* sw,
                                   const float* bias, const uint16_t* residual, uint16_t* y);
  void (*f32_int8_dequantize_row)(const int32_t* acc, int64_t n, float sx, const float* sw,
                                  const float* bias, const float* residual, float* y);

  // Channels-last ([pixels][C]) helpers for GroupNorm:
  // s1[c] += sum_p (x[p][c] - shift[c]), s2[c] += sum_p (x[p][c] - shift[c])^2, accumulated in
  // float32 blocks of pixels (`scratch`: 2 * C floats) and added into the double sums.
  void (*bf16_channel_sums)(const uint16_t* x, int64_t pixels, int64_t C, const float* shift,
                            float* scratch, double* s1, double* s2);
  // y[p][c] = x[p][c] * scale[c] + shift[c], then SiLU if `silu`.
  void (*bf16_channel_scale_shift)(const uint16_t* x, int64_t pixels, int64_t C, const float* scale,
                                   const float* shift, bool silu, uint16_t* y);

  // The float32 transforms of Winograd's F(2x2, 3x3) and F(4x4, 3x3) convolutions (16 and 36
  // planes); see winograd_impl.h for the layouts and nn/winograd_conv.h for the caller.
  WinogradWeights f32_winograd_weights, f32_winograd4_weights;
  WinogradInput f32_winograd_input, f32_winograd4_input;
  WinogradOutput f32_winograd_output, f32_winograd4_output;
};

const CpuKernels* portable_cpu_kernels();
const CpuKernels* avx2_cpu_kernels();    // nullptr unless compiled with AVX2
const CpuKernels* avx512_cpu_kernels();  // nullptr unless compiled with AVX-512

}  // namespace diffuse::nn::kernels
