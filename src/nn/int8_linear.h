// A linear layer whose weight is kept as int8 rows (quant::GgmlType::I8_ROWS, `--weights int8`)
// multiplied in 8-bit integers on the CPU: each row of the input is quantized on the fly to
// unsigned codes with one scale per row (symmetric: max|x| / 127), oneDNN's integer GEMM
// (dnnl_gemm_u8s8s32: VPDPBUSD on CPUs with AVX512-VNNI, 64 products per instruction against
// VDPBF16PS's 32) sums code products exactly in int32, and one pass scales each sum by its row's
// and its output's scale and adds the bias (and a residual) in float32, rounding once.
//
// The error against the plain product is that of the two roundings to codes, at most half a
// step each: |x.w - x'.w'| <= sum_k (|x_k| sw/2 + |w_k| sx/2 + sx sw/4) per output.
// Where this does not run (no oneDNN headers at build time, no VNNI, another device or dtype)
// the layer dequantizes its weight instead (quant::dequantize_weight) and multiplies as usual.
#pragma once
#include <torch/types.h>

#include <functional>

#include "quant/quantized_weight.h"

namespace diffuse::nn {

// Whether this build has the integer GEMM and this CPU runs it natively.
bool int8_gemm_available();
// acc[rows, n] = (codes - 128) . wq^T, summed exactly in int32 by oneDNN's integer GEMM: `rows`
// rows of `k` unsigned codes (the offset makes them signed) against an [n, k] int8 matrix.
// Needs int8_gemm_available(); Error when oneDNN fails.
void int8_gemm_offset_codes(const uint8_t* codes, int64_t rows, int64_t k, const int8_t* wq,
                            int64_t n, int32_t* acc);
// y = rows @ dequantized(w)^T + bias (+ residual) for `rows` input rows whose unsigned codes
// `quantize_row(i, codes)` writes (K = w.cols of them) and returns the row's scale: the codes
// in chunks of up to 1024 rows, oneDNN's integer GEMM, then each sum scaled and the bias and
// residual added in float32, rounded once into y. y and residual: [rows, w.rows] contiguous,
// float32 or bf16 (y's dtype); bias: float32 [w.rows] or undefined. The driver of int8_linear
// and int8_conv2d; needs int8_gemm_available().
void int8_rows_product(int64_t rows, const quant::QuantizedWeight& w,
                       const std::function<float(int64_t row, uint8_t* codes)>& quantize_row,
                       const torch::Tensor& bias, const torch::Tensor& residual, torch::Tensor& y);
// Whether int8_linear runs `input` ([..., in], float32 or bf16, on the CPU) with `w`: an
// I8_ROWS weight on the CPU, and int8_gemm_available().
bool int8_linear_runs(const torch::Tensor& input, const quant::QuantizedWeight& w);
// Whether a layer takes int8_linear for `input`: int8_linear_runs, and the integer product is
// the faster one here. On CPUs with AMX, oneDNN's bf16 matmul (AMX tiles) outruns the VNNI
// integer GEMM, so bf16 inputs there multiply by the dequantized weight instead (SD2.1-base UNet
// step at 512x512 on a 2-core Sapphire Rapids: int8 GEMM 3.6-3.8 s, bf16 2.9-3.3 s).
bool int8_linear_chosen(const torch::Tensor& input, const quant::QuantizedWeight& w);
// input @ dequantized(w)^T + bias (+ residual), as above; bias (float32 or the input's dtype,
// [out]) and residual (the output's shape and dtype) may be undefined. Needs int8_linear_runs.
torch::Tensor int8_linear(const torch::Tensor& input, const quant::QuantizedWeight& w,
                          const torch::Tensor& bias, const torch::Tensor& residual = {});

}  // namespace diffuse::nn
