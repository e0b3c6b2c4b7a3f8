// AVX-512 flash kernels (CMake compiles this file with -mavx512f/bw/vl/dq, and -mavx512bf16
// where the compiler has it; flash.cpp runs them only on CPUs that report those features).
//
// Both kernels tile the work the same way: a task is a block of up to 48 query rows of one
// (batch, head); keys are visited in blocks of 256; six query rows at a time compute their
// scores (6 x 64 register tile), update the online softmax (max, exp, sum in float32) and add
// probabilities x V into float32 accumulators. Scores never leave L1/L2.
//
//  - "avx512": float32 dot products (bf16 inputs are widened when packed).
//  - "avx512-bf16": bf16 inputs stay bf16; VDPBF16PS multiplies pairs of bf16 and accumulates
//    in float32 (K packed as [D/2][Nk][2], V as [Nk/2][D][2], probabilities rounded to bf16
//    before the V product, as the math backend does).
#include "nn/attention/flash_kernel.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
// GCC 12's AVX-512 intrinsics build their "undefined" operands with a self-initialised local
// (`__m512 __Y = __Y;`), which -Wmaybe-uninitialized reports at every inlined use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "nn/attention/flash_common.h"

namespace diffuse::nn::flash {
namespace {

constexpr int64_t kRows = 6;         // query rows per register tile
constexpr int64_t kBlockRows = 48;   // query rows per task (a multiple of kRows)
constexpr int64_t kBlockKeys = 256;  // keys per online-softmax block (a multiple of 64)
constexpr int64_t kLanes = 16;
static_assert(kLanes == kF32PackLanes, "the float32 kernel reads the shared packing");

inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

// exp(x) to ~2 ulp (Cephes' polynomial); scalef builds 2^n and flushes x < -103 to zero.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-103.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// 2^t to ~4e-5 relative (degree-4 Taylor of 2^f, f = t - round(t) in [-1/2, 1/2]) for
// probabilities that are rounded to bf16 (2^-9) right after. The caller folds log2(e) into
// the score scale and shift, so the reduction is one exact subtraction: eight instructions
// against exp512's eleven, which matters because the softmax is the kernel's only work that
// is not a VDPBF16PS. scalef builds 2^n and flushes t < -126 to zero.
inline __m512 exp2_512_bf16(__m512 t) {
  t = _mm512_max_ps(t, _mm512_set1_ps(-127.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(9.6181291e-3f);                  // ln2^4 / 24
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));  // ln2^3 / 6
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));  // ln2^2 / 2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));  // ln2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// float32 -> bf16, round to nearest even, NaN kept (no AVX512-BF16 needed).
inline __m256i to_bf16(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  u = _mm512_srli_epi32(u, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  u = _mm512_mask_mov_epi32(u, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(u);
}

inline void store_out_row(const Problem& p, const float* o, float inv, int64_t b, int64_t h,
                          int64_t row) {
  const int64_t oo = offset(p.out_stride, b, h, row), D = p.head_dim;
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int64_t d = 0; d < D; d += kLanes) {
    const __mmask16 mask = tail_mask(min_i64(kLanes, D - d));
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(o + d), vinv);
    if (p.bf16)
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p.out) + oo + d, mask, to_bf16(v));
    else
      _mm512_mask_storeu_ps(static_cast<float*>(p.out) + oo + d, mask, v);
  }
}

// Online-softmax update of one row of scores s[0, len): writes probabilities
// exp(scale * s - m_new) to prob (zero from `visible` up to len rounded to 16) and returns
// the factor that rescales the row's previous sums. Store(ptr, vector) writes 16 values.
// `known_max` is the row's maximum score when the caller has it (else NaN).
template <bool kBf16Exp, typename Out, typename Store>
inline float softmax_row(const float* s, int64_t len, int64_t visible, float scale, float& m,
                         float& l, Out* prob, Store store, float known_max) {
  const int64_t end = round_up(len, kLanes);
  if (visible == 0) {
    for (int64_t j = 0; j < end; j += kLanes) store(prob + j, _mm512_setzero_ps());
    return 1.0f;
  }
  int64_t j = 0;
  float row_max = known_max;
  if (row_max != row_max) {
    __m512 vmax = _mm512_set1_ps(kNegInf);
    for (; j + kLanes <= visible; j += kLanes) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + j));
    if (j < visible) {
      const __mmask16 mask = tail_mask(visible - j);
      vmax = _mm512_mask_max_ps(vmax, mask, vmax, _mm512_maskz_loadu_ps(mask, s + j));
    }
    row_max = _mm512_reduce_max_ps(vmax);
  }
  const float m_new = max_f(m, row_max * scale);
  const float alpha = m == kNegInf ? 0.0f : __builtin_expf(m - m_new);
  // exp(scale * s - m_new), or 2^(log2(e) * (scale * s - m_new)) with the factor folded in.
  const float base = kBf16Exp ? 1.44269504088896341f : 1.0f;
  const __m512 vscale = _mm512_set1_ps(scale * base), vshift = _mm512_set1_ps(-m_new * base);
  __m512 vsum = _mm512_setzero_ps();
  auto expf16 = [](__m512 x) { return kBf16Exp ? exp2_512_bf16(x) : exp512(x); };
  for (j = 0; j + kLanes <= visible; j += kLanes) {
    const __m512 e = expf16(_mm512_fmadd_ps(_mm512_loadu_ps(s + j), vscale, vshift));
    vsum = _mm512_add_ps(vsum, e);
    store(prob + j, e);
  }
  if (j < visible) {
    const __mmask16 mask = tail_mask(visible - j);
    const __m512 x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, s + j), vscale, vshift);
    const __m512 e = _mm512_maskz_mov_ps(mask, expf16(x));
    vsum = _mm512_add_ps(vsum, e);
    store(prob + j, e);
    j += kLanes;
  }
  for (; j < end; j += kLanes) store(prob + j, _mm512_setzero_ps());
  m = m_new;
  l = l * alpha + _mm512_reduce_add_ps(vsum);
  return alpha;
}

// ---- float32 kernel: K packed as float [D][nkp], V as float [Nk][dp] ----------------------
// K transposed so that both inner products run over contiguous memory.
int64_t f32_packed_bytes(const Problem& p) {
  F32Layout l(p);
  return aligned_bytes<float>(p.head_dim * l.nkp) + aligned_bytes<float>(p.nk * l.dp);
}

void f32_pack(const Problem& p, int64_t b, int64_t h, void* packed) {
  F32Layout l(p);
  Arena arena{static_cast<uint8_t*>(packed)};
  float* kp = arena.take<float>(p.head_dim * l.nkp);
  float* vp = arena.take<float>(p.nk * l.dp);
  std::memset(kp, 0, sizeof(float) * p.head_dim * l.nkp);
  std::memset(vp, 0, sizeof(float) * p.nk * l.dp);
  for (int64_t j = 0; j < p.nk; ++j) {
    const int64_t ko = offset(p.k_stride, b, h, j), vo = offset(p.v_stride, b, h, j);
    for (int64_t d = 0; d < p.head_dim; ++d) kp[d * l.nkp + j] = load_elem(p, p.k, ko + d);
    for (int64_t d = 0; d < p.head_dim; ++d) vp[j * l.dp + d] = load_elem(p, p.v, vo + d);
  }
}

int64_t f32_scratch_bytes(const Problem& p) {
  F32Layout l(p);
  return aligned_bytes<float>(kBlockRows * p.head_dim) + aligned_bytes<float>(kBlockRows * l.dp) +
         aligned_bytes<float>(kRows * kBlockKeys) + 2 * aligned_bytes<float>(kBlockRows) +
         aligned_bytes<float>(kRows);
}

// s[r][col + i] = q[r] . k[kb + col + i], i < 16 * C.
template <int C>
inline void f32_qk(const float* q, int64_t D, const float* kp, int64_t nkp, int64_t col, float* s) {
  __m512 acc[kRows][C];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 kv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) kv[c] = _mm512_loadu_ps(kp + d * nkp + col + c * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 a = _mm512_set1_ps(q[r * D + d]);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(a, kv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(s + r * kBlockKeys + col + c * kLanes, acc[r][c]);
}

// o[r][d0 + i] = o[r][d0 + i] * alpha[r] + sum_j prob[r][j] v[kb + j][d0 + i], i < 16 * C.
template <int C>
inline void f32_pv(const float* prob, const float* vp, int64_t dp, int64_t kb, int64_t keys,
                   const float* alpha, float* o, int64_t d0) {
  __m512 acc[kRows][C];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * dp + d0 + c * kLanes), a);
  }
  for (int64_t j = 0; j < keys; ++j) {
    __m512 vv[C];
    const float* v = vp + (kb + j) * dp + d0;
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) vv[c] = _mm512_loadu_ps(v + c * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 a = _mm512_set1_ps(prob[r * kBlockKeys + j]);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(a, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + r * dp + d0 + c * kLanes, acc[r][c]);
}

void f32_attend(const Problem& p, int64_t b, int64_t h, int64_t row_begin, int64_t row_end,
                const void* packed, void* scratch) {
  F32Layout lay(p);
  const int64_t D = p.head_dim, rows = row_end - row_begin;
  Arena in{static_cast<uint8_t*>(const_cast<void*>(packed))};
  const float* kp = in.take<float>(D * lay.nkp);
  const float* vp = in.take<float>(p.nk * lay.dp);
  Arena arena{static_cast<uint8_t*>(scratch)};
  float* q = arena.take<float>(kBlockRows * D);
  float* o = arena.take<float>(kBlockRows * lay.dp);
  float* s = arena.take<float>(kRows * kBlockKeys);
  float* m = arena.take<float>(kBlockRows);
  float* l = arena.take<float>(kBlockRows);
  float* alpha = arena.take<float>(kRows);

  const int64_t padded_rows = round_up(rows, kRows);
  for (int64_t r = 0; r < padded_rows; ++r) {
    const int64_t qo = offset(p.q_stride, b, h, row_begin + r);
    for (int64_t d = 0; d < D; ++d) q[r * D + d] = r < rows ? load_elem(p, p.q, qo + d) : 0.0f;
    std::memset(o + r * lay.dp, 0, sizeof(float) * lay.dp);
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  auto store = [](float* dst, __m512 v) { _mm512_storeu_ps(dst, v); };
  const int64_t key_end = p.causal ? min_i64(p.nk, row_end) : p.nk;
  for (int64_t kb = 0; kb < key_end; kb += kBlockKeys) {
    const int64_t len = min_i64(kBlockKeys, p.nk - kb), cols = round_up(len, kLanes);
    for (int64_t r0 = 0; r0 < padded_rows; r0 += kRows) {
      const float* qr = q + r0 * D;
      int64_t col = 0;
      for (; col + 4 * kLanes <= cols; col += 4 * kLanes)
        f32_qk<4>(qr, D, kp + kb, lay.nkp, col, s);
      switch ((cols - col) / kLanes) {
        case 3:
          f32_qk<3>(qr, D, kp + kb, lay.nkp, col, s);
          break;
        case 2:
          f32_qk<2>(qr, D, kp + kb, lay.nkp, col, s);
          break;
        case 1:
          f32_qk<1>(qr, D, kp + kb, lay.nkp, col, s);
          break;
        default:
          break;
      }
      for (int64_t r = 0; r < kRows; ++r) {
        const int64_t visible = r0 + r < rows ? visible_keys(p, row_begin + r0 + r, kb, len) : 0;
        alpha[r] = softmax_row<false>(s + r * kBlockKeys, len, visible, p.scale, m[r0 + r],
                                      l[r0 + r], s + r * kBlockKeys, store, __builtin_nanf(""));
      }
      float* orow = o + r0 * lay.dp;
      int64_t d0 = 0;
      for (; d0 + 4 * kLanes <= lay.dp; d0 += 4 * kLanes)
        f32_pv<4>(s, vp, lay.dp, kb, len, alpha, orow, d0);
      switch ((lay.dp - d0) / kLanes) {
        case 3:
          f32_pv<3>(s, vp, lay.dp, kb, len, alpha, orow, d0);
          break;
        case 2:
          f32_pv<2>(s, vp, lay.dp, kb, len, alpha, orow, d0);
          break;
        case 1:
          f32_pv<1>(s, vp, lay.dp, kb, len, alpha, orow, d0);
          break;
        default:
          break;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    store_out_row(p, o + r * lay.dp, 1.0f / l[r], b, h, row_begin + r);
}

const Kernel kF32Kernel = {"avx512", kBlockRows,        f32_packed_bytes,
                           f32_pack, f32_scratch_bytes, f32_attend};

// ---- bf16 kernel: VDPBF16PS over pairs ------------------------------------------------------
#if defined(__AVX512BF16__)

// K packed as bf16 [D2][nkp][2] (pairs of head dims interleaved per key), V as bf16
// [Nk2][dp][2] (pairs of keys interleaved per head dim); zero padded.
struct Bf16Layout {
  int64_t nkp, dp, d2, nk2;
  explicit Bf16Layout(const Problem& p)
      : nkp(round_up(p.nk, kLanes)),
        dp(round_up(p.head_dim, kLanes)),
        d2((p.head_dim + 1) / 2),
        nk2((p.nk + 1) / 2) {}
};

// GCC and Clang allow casts between vector types of the same size.
inline __m512bh as_bh(__m512i v) {
  return (__m512bh)v;
}

int64_t bf16_packed_bytes(const Problem& p) {
  Bf16Layout l(p);
  return aligned_bytes<uint16_t>(l.d2 * l.nkp * 2) + aligned_bytes<uint16_t>(l.nk2 * l.dp * 2);
}

void bf16_pack(const Problem& p, int64_t b, int64_t h, void* packed) {
  Bf16Layout l(p);
  Arena arena{static_cast<uint8_t*>(packed)};
  uint16_t* kp = arena.take<uint16_t>(l.d2 * l.nkp * 2);
  uint16_t* vp = arena.take<uint16_t>(l.nk2 * l.dp * 2);
  std::memset(kp, 0, sizeof(uint16_t) * l.d2 * l.nkp * 2);
  std::memset(vp, 0, sizeof(uint16_t) * l.nk2 * l.dp * 2);
  const uint16_t* k = static_cast<const uint16_t*>(p.k);
  const uint16_t* v = static_cast<const uint16_t*>(p.v);
  for (int64_t j = 0; j < p.nk; ++j) {
    const uint16_t* krow = k + offset(p.k_stride, b, h, j);
    const uint16_t* vrow = v + offset(p.v_stride, b, h, j);
    for (int64_t d = 0; d < p.head_dim; ++d) kp[((d / 2) * l.nkp + j) * 2 + (d & 1)] = krow[d];
    for (int64_t d = 0; d < p.head_dim; ++d) vp[((j / 2) * l.dp + d) * 2 + (j & 1)] = vrow[d];
  }
}

int64_t bf16_scratch_bytes(const Problem& p) {
  Bf16Layout l(p);
  return aligned_bytes<uint32_t>(kBlockRows * l.d2) + aligned_bytes<float>(kBlockRows * l.dp) +
         aligned_bytes<float>(kRows * kBlockKeys) + aligned_bytes<uint16_t>(kRows * kBlockKeys) +
         2 * aligned_bytes<float>(kBlockRows) + aligned_bytes<float>(kRows);
}

// Also folds the tile into the running per-row maxima rowmax[r].
template <int C>
inline void bf16_qk(const uint32_t* q, int64_t d2, const uint16_t* kp, int64_t nkp, int64_t col,
                    float* s, __m512* rowmax) {
  __m512 acc[kRows][C];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < d2; ++i) {
    __m512i kv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) kv[c] = _mm512_loadu_si512(kp + (i * nkp + col + c * kLanes) * 2);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(q[r * d2 + i]));
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bh(a), as_bh(kv[c]));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      _mm512_storeu_ps(s + r * kBlockKeys + col + c * kLanes, acc[r][c]);
      rowmax[r] = _mm512_max_ps(rowmax[r], acc[r][c]);
    }
}

// prob: bf16 [kRows][kBlockKeys] read as pairs; keys rounded up to even (the odd tail is 0).
template <int C>
inline void bf16_pv(const uint16_t* prob, const uint16_t* vp, int64_t dp, int64_t kb, int64_t keys,
                    const float* alpha, float* o, int64_t d0) {
  const uint32_t* pairs = reinterpret_cast<const uint32_t*>(prob);
  __m512 acc[kRows][C];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * dp + d0 + c * kLanes), a);
  }
  const int64_t npairs = (keys + 1) / 2;
  for (int64_t i = 0; i < npairs; ++i) {
    __m512i vv[C];
    const uint16_t* v = vp + ((kb / 2 + i) * dp + d0) * 2;
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) vv[c] = _mm512_loadu_si512(v + c * kLanes * 2);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(pairs[r * (kBlockKeys / 2) + i]));
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bh(a), as_bh(vv[c]));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + r * dp + d0 + c * kLanes, acc[r][c]);
}

// bf16 inputs only (flash.cpp routes float32 to the float32 kernels).
void bf16_attend(const Problem& p, int64_t b, int64_t h, int64_t row_begin, int64_t row_end,
                 const void* packed, void* scratch) {
  Bf16Layout lay(p);
  const int64_t D = p.head_dim, rows = row_end - row_begin;
  Arena in{static_cast<uint8_t*>(const_cast<void*>(packed))};
  const uint16_t* kp = in.take<uint16_t>(lay.d2 * lay.nkp * 2);
  const uint16_t* vp = in.take<uint16_t>(lay.nk2 * lay.dp * 2);
  Arena arena{static_cast<uint8_t*>(scratch)};
  uint32_t* q = arena.take<uint32_t>(kBlockRows * lay.d2);
  float* o = arena.take<float>(kBlockRows * lay.dp);
  float* s = arena.take<float>(kRows * kBlockKeys);
  uint16_t* prob = arena.take<uint16_t>(kRows * kBlockKeys);
  float* m = arena.take<float>(kBlockRows);
  float* l = arena.take<float>(kBlockRows);
  float* alpha = arena.take<float>(kRows);

  const int64_t padded_rows = round_up(rows, kRows);
  const uint16_t* qsrc = static_cast<const uint16_t*>(p.q);
  for (int64_t r = 0; r < padded_rows; ++r) {
    uint16_t* qrow = reinterpret_cast<uint16_t*>(q + r * lay.d2);
    std::memset(qrow, 0, sizeof(uint32_t) * lay.d2);
    if (r < rows)
      std::memcpy(qrow, qsrc + offset(p.q_stride, b, h, row_begin + r), sizeof(uint16_t) * D);
    std::memset(o + r * lay.dp, 0, sizeof(float) * lay.dp);
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  auto store = [](uint16_t* dst, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(v));
  };
  const int64_t key_end = p.causal ? min_i64(p.nk, row_end) : p.nk;
  for (int64_t kb = 0; kb < key_end; kb += kBlockKeys) {
    const int64_t len = min_i64(kBlockKeys, p.nk - kb), cols = round_up(len, kLanes);
    for (int64_t r0 = 0; r0 < padded_rows; r0 += kRows) {
      const uint32_t* qr = q + r0 * lay.d2;
      const uint16_t* kblock = kp + kb * 2;
      __m512 rowmax[kRows];
      for (auto& v : rowmax) v = _mm512_set1_ps(kNegInf);
      int64_t col = 0;
      for (; col + 4 * kLanes <= cols; col += 4 * kLanes)
        bf16_qk<4>(qr, lay.d2, kblock, lay.nkp, col, s, rowmax);
      switch ((cols - col) / kLanes) {
        case 3:
          bf16_qk<3>(qr, lay.d2, kblock, lay.nkp, col, s, rowmax);
          break;
        case 2:
          bf16_qk<2>(qr, lay.d2, kblock, lay.nkp, col, s, rowmax);
          break;
        case 1:
          bf16_qk<1>(qr, lay.d2, kblock, lay.nkp, col, s, rowmax);
          break;
        default:
          break;
      }
      // The tile maxima are the rows' maxima only when every column is a visible key.
      const bool full = !p.causal && len == cols;
      for (int64_t r = 0; r < kRows; ++r) {
        const int64_t visible = r0 + r < rows ? visible_keys(p, row_begin + r0 + r, kb, len) : 0;
        const float known = full ? _mm512_reduce_max_ps(rowmax[r]) : __builtin_nanf("");
        alpha[r] = softmax_row<true>(s + r * kBlockKeys, len, visible, p.scale, m[r0 + r],
                                     l[r0 + r], prob + r * kBlockKeys, store, known);
      }
      float* orow = o + r0 * lay.dp;
      int64_t d0 = 0;
      for (; d0 + 4 * kLanes <= lay.dp; d0 += 4 * kLanes)
        bf16_pv<4>(prob, vp, lay.dp, kb, len, alpha, orow, d0);
      switch ((lay.dp - d0) / kLanes) {
        case 3:
          bf16_pv<3>(prob, vp, lay.dp, kb, len, alpha, orow, d0);
          break;
        case 2:
          bf16_pv<2>(prob, vp, lay.dp, kb, len, alpha, orow, d0);
          break;
        case 1:
          bf16_pv<1>(prob, vp, lay.dp, kb, len, alpha, orow, d0);
          break;
        default:
          break;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    store_out_row(p, o + r * lay.dp, 1.0f / l[r], b, h, row_begin + r);
}

const Kernel kBf16Kernel = {"avx512-bf16", kBlockRows,         bf16_packed_bytes,
                            bf16_pack,     bf16_scratch_bytes, bf16_attend};
#endif  // __AVX512BF16__

}  // namespace

const Kernel* avx512_kernel() {
  return &kF32Kernel;
}

#if defined(__AVX512BF16__)
const Kernel* avx512_bf16_kernel() {
  return &kBf16Kernel;
}
#else
const Kernel* avx512_bf16_kernel() {
  return nullptr;
}
#endif

}  // namespace diffuse::nn::flash

#else  // no AVX-512 flags for this file (non-x86 build or old compiler)

namespace diffuse::nn::flash {
const Kernel* avx512_kernel() {
  return nullptr;
}
const Kernel* avx512_bf16_kernel() {
  return nullptr;
}
}  // namespace diffuse::nn::flash

#endif
