// A bf16 linear-layer product for the CPU with AVX512-BF16 (VDPBF16PS), for the few hundred
// rows of text encoders (77-512 tokens); nn/cpu_bf16_linear.h says when it runs.
//
// The weight is read in its own layout ([out][in], as nn::Linear keeps it): VDPBF16PS multiplies
// pairs along the shared dimension, so a row of the input and a row of the weight are both
// contiguous and nothing is packed or copied. Each register tile holds 6 input rows x 4 outputs
// as 24 float32 accumulators of 16 lanes, summed across lanes once at the end of the row.
//
// Torch-free (compiled with the AVX-512 flags; see cpu_kernels.h for why).
#pragma once
#include <cstdint>

namespace diffuse::nn::kernels {

// C[m][n] = bf16(sum_k A[m][k] * W[n][k] + bias[n] + R[m][n]) for m in [0, M), n in [n0, n1):
// products of bf16 pairs summed in float32, rounded to bf16 once (nearest even). bias (float32,
// indexed by n) and R (bf16, row stride ldr) may be null. Strides in elements. The caller
// splits [0, N) among threads; calls on disjoint column ranges may run at the same time.
struct Bf16GemmArgs {
  const uint16_t* a = nullptr;
  int64_t lda = 0;
  const uint16_t* w = nullptr;
  int64_t ldw = 0;
  const float* bias = nullptr;
  const uint16_t* residual = nullptr;
  int64_t ldr = 0;
  uint16_t* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0, k = 0;
};
using Bf16GemmNT = void (*)(const Bf16GemmArgs& args, int64_t n0, int64_t n1);

// Null unless this build has the AVX512-BF16 kernel; the caller checks cpu_features().avx512_bf16.
Bf16GemmNT avx512_bf16_gemm_nt();

// Outputs one call should own so that a tile's weight rows stay in L1 while the rows of A
// stream: the grain for splitting [0, N).
constexpr int64_t kBf16GemmColumnGrain = 16;

}  // namespace diffuse::nn::kernels
