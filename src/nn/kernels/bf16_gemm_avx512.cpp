// The AVX512-BF16 linear-layer product of bf16_gemm.h (CMake compiles this file with the
// AVX-512 flags, and -mavx512bf16 where the compiler has it).
#include "nn/kernels/bf16_gemm.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512BF16__)
// See flash_kernel_avx512.cpp: GCC 12's intrinsics trip -Wmaybe-uninitialized when inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>

namespace diffuse::nn::kernels {
namespace {

constexpr int kRows = 6;    // input rows per register tile
constexpr int kCols = 4;    // outputs per register tile (one 4-way lane reduction)
constexpr int64_t kK = 32;  // bf16 values per 512-bit load
// Input rows per panel: the panel (rows x K bf16) stays in L2 while every weight tile of the
// call passes over it once.
constexpr int64_t kPanelBytes = 512 * 1024;

inline __m512bh as_bh(__m512i v) {
  return (__m512bh)v;
}

// The four 16-lane sums of v0..v3 in one vector: pairs of lanes within each 128-bit block, then
// the four blocks.
inline __m128 sum4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  const __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
  const __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
  const __m512d ad = _mm512_castps_pd(a), bd = _mm512_castps_pd(b);
  const __m512 c = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ad, bd)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(ad, bd)));
  const __m256 d = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
  return _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
}

// Four bf16 values widened to float32 (exact).
inline __m128 load_bf16x4(const uint16_t* p, __mmask8 mask) {
  const __m128i h = _mm_maskz_loadu_epi16(mask, p);
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
}

// Four float32 values rounded to bf16 (nearest even, NaN kept quiet) and stored under `mask`.
inline void store_bf16x4(uint16_t* p, __m128 v, __mmask8 mask) {
  __m128i u = _mm_castps_si128(v);
  const __m128i lsb = _mm_and_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(1));
  u = _mm_add_epi32(u, _mm_add_epi32(lsb, _mm_set1_epi32(0x7fff)));
  u = _mm_srli_epi32(u, 16);
  const __mmask8 nan = _mm_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  u = _mm_mask_mov_epi32(u, nan, _mm_set1_epi32(0x7fc0));
  _mm_mask_storeu_epi16(p, mask, _mm_cvtepi32_epi16(u));
}

// R input rows x 4 weight rows over the whole shared dimension; sums[r] holds the 4 outputs
// of row r. Rows past the matrix edge are given as repeats of a valid row by the caller.
template <int R>
__attribute__((always_inline)) inline void tile(const uint16_t* const* a, const uint16_t* const* w,
                                                int64_t K, __m128* sums) {
  // Fully unrolled, so that the 4R accumulators live in registers (GCC keeps a loop over them
  // in memory otherwise).
  __m512 acc[R][kCols];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + kK <= K; k += kK) {
    const __m512i w0 = _mm512_loadu_si512(w[0] + k), w1 = _mm512_loadu_si512(w[1] + k),
                  w2 = _mm512_loadu_si512(w[2] + k), w3 = _mm512_loadu_si512(w[3] + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh x = as_bh(_mm512_loadu_si512(a[r] + k));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, as_bh(w0));
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, as_bh(w1));
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], x, as_bh(w2));
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], x, as_bh(w3));
    }
  }
  if (k < K) {  // the last K % 32 values; zeros past the end add nothing
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (K - k)) - 1);
    const __m512i w0 = _mm512_maskz_loadu_epi16(m, w[0] + k),
                  w1 = _mm512_maskz_loadu_epi16(m, w[1] + k),
                  w2 = _mm512_maskz_loadu_epi16(m, w[2] + k),
                  w3 = _mm512_maskz_loadu_epi16(m, w[3] + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh x = as_bh(_mm512_maskz_loadu_epi16(m, a[r] + k));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, as_bh(w0));
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, as_bh(w1));
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], x, as_bh(w2));
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], x, as_bh(w3));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) sums[r] = sum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
}

// Rows [m0, m0 + R) x outputs [n, n + cols) of C, cols <= 4.
template <int R>
void tile_rows(const Bf16GemmArgs& g, int64_t m0, int64_t n, int64_t cols) {
  const uint16_t* a[R];
  for (int r = 0; r < R; ++r) a[r] = g.a + (m0 + r) * g.lda;
  const uint16_t* w[kCols];
  for (int c = 0; c < kCols; ++c) w[c] = g.w + (n + std::min<int64_t>(c, cols - 1)) * g.ldw;
  __m128 sums[R];
  tile<R>(a, w, g.k, sums);
  const __mmask8 mask = static_cast<__mmask8>((1u << cols) - 1u);
  const __m128 bias = g.bias ? _mm_maskz_loadu_ps(mask, g.bias + n) : _mm_setzero_ps();
  for (int r = 0; r < R; ++r) {
    __m128 v = _mm_add_ps(sums[r], bias);
    if (g.residual) v = _mm_add_ps(v, load_bf16x4(g.residual + (m0 + r) * g.ldr + n, mask));
    store_bf16x4(g.c + (m0 + r) * g.ldc + n, v, mask);
  }
}

void rows_at(const Bf16GemmArgs& g, int64_t m0, int64_t rows, int64_t n, int64_t cols) {
  switch (rows) {
    case 1:
      return tile_rows<1>(g, m0, n, cols);
    case 2:
      return tile_rows<2>(g, m0, n, cols);
    case 3:
      return tile_rows<3>(g, m0, n, cols);
    case 4:
      return tile_rows<4>(g, m0, n, cols);
    case 5:
      return tile_rows<5>(g, m0, n, cols);
    default:
      return tile_rows<kRows>(g, m0, n, cols);
  }
}

void gemm_nt(const Bf16GemmArgs& g, int64_t n0, int64_t n1) {
  if (g.m <= 0 || n1 <= n0) return;
  const int64_t panel_rows =
      std::max<int64_t>(kRows, kPanelBytes / (2 * std::max<int64_t>(g.k, 1)) / kRows * kRows);
  for (int64_t p0 = 0; p0 < g.m; p0 += panel_rows) {
    const int64_t p1 = std::min(g.m, p0 + panel_rows);
    for (int64_t n = n0; n < n1; n += kCols) {
      const int64_t cols = std::min<int64_t>(kCols, n1 - n);
      for (int64_t m = p0; m < p1; m += kRows)
        rows_at(g, m, std::min<int64_t>(kRows, p1 - m), n, cols);
    }
  }
}

}  // namespace

Bf16GemmNT avx512_bf16_gemm_nt() {
  return &gemm_nt;
}

}  // namespace diffuse::nn::kernels

#else  // built without AVX512-BF16 (non-x86, or a compiler without -mavx512bf16)

namespace diffuse::nn::kernels {
Bf16GemmNT avx512_bf16_gemm_nt() {
  return nullptr;
}
}  // namespace diffuse::nn::kernels
#endif
