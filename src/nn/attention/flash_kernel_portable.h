// The portable flash kernel: float32 math on 16-float GCC vector types, which the compiler
// maps onto the target's registers. Included by
// flash_kernel_portable.cpp (baseline ISA) and flash_kernel_avx2.cpp (-mavx2 -mfma), each
// of which defines FLASH_KERNEL_NAME and FLASH_KERNEL_GETTER first.
//
// K is packed as float32 panels of 16 keys, [Nk/16][D][16], and V as panels of 16 head dims,
// [D/16][Nk][16]: a micro-tile then reads one contiguous panel. K packed [D][Nk] (as the
// AVX-512 kernel has it) puts the D rows a tile reads Nk floats apart, which for Nk a multiple
// of 1024 all fall into the same few L1 sets: SD2.1's 64x64-token self-attention ran ~15 %
// slower that way on an AVX2 EPYC.
#include "nn/attention/flash_common.h"

namespace diffuse::nn::flash {
namespace {

constexpr int64_t kBlockRows = 48;   // query rows per task (a multiple of kRows)
constexpr int64_t kBlockKeys = 256;  // keys per block of the online softmax
constexpr int64_t kLanes = 16;
static_assert(kLanes == kF32PackLanes, "panels are as wide as F32Layout pads");

// The target's native float vector as a GCC/Clang vector type (wider types would be lowered
// through memory). Tiles are kLanes = 16 floats wide, i.e. kVecs vectors.
using vec::exp2v;
using vec::splat;
using vec::VecF;
constexpr int64_t kWidth = vec::kVecWidth;
constexpr int64_t kVecs = kLanes / kWidth;
// Query rows per micro-tile: 12 accumulator vectors, plus kVecs loaded K/V vectors and one
// broadcast, fill the 16 vector registers of SSE/AVX2 (6 rows x 2 ymm on AVX2: 12 FMAs per 8
// loads, so the FMA units and not the loads set the pace; 4 rows gave 8 per 6).
constexpr int64_t kRows = 12 / kVecs;
static_assert(kBlockRows % kRows == 0, "a task holds whole micro-tiles");

inline VecF loadv(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storev(float* p, VecF v) {
  std::memcpy(p, &v, sizeof v);
}

inline float exp2_1(float x) {
  return exp2v(splat(x))[0];
}

constexpr float kLog2e = 1.44269504088896341f;

int64_t packed_bytes(const Problem& p) {
  F32Layout l(p);
  return aligned_bytes<float>(p.head_dim * l.nkp) + aligned_bytes<float>(l.nkp * l.dp);
}

void pack(const Problem& p, int64_t b, int64_t h, void* packed) {
  F32Layout l(p);
  const int64_t D = p.head_dim;
  Arena arena{static_cast<uint8_t*>(packed)};
  float* kp = arena.take<float>(D * l.nkp);
  float* vp = arena.take<float>(l.nkp * l.dp);
  std::memset(kp, 0, sizeof(float) * D * l.nkp);
  std::memset(vp, 0, sizeof(float) * l.nkp * l.dp);
  for (int64_t j = 0; j < p.nk; ++j) {
    const int64_t ko = offset(p.k_stride, b, h, j), vo = offset(p.v_stride, b, h, j);
    float* k_panel = kp + (j / kLanes) * D * kLanes + j % kLanes;
    for (int64_t d = 0; d < D; ++d) k_panel[d * kLanes] = load_elem(p, p.k, ko + d);
    for (int64_t d = 0; d < D; ++d)
      vp[(d / kLanes) * l.nkp * kLanes + j * kLanes + d % kLanes] = load_elem(p, p.v, vo + d);
  }
}

int64_t scratch_bytes(const Problem& p) {
  F32Layout l(p);
  return aligned_bytes<float>(kBlockRows * p.head_dim) + aligned_bytes<float>(kBlockRows * l.dp) +
         aligned_bytes<float>(kRows * kBlockKeys) + 2 * aligned_bytes<float>(kBlockRows) +
         aligned_bytes<float>(kRows);
}

// s[r][j] = q[r] . k[kb + j] for j < cols (a multiple of 16).
void qk_tile(const float* q, int64_t D, const float* kp, int64_t kb, int64_t cols, float* s) {
  for (int64_t j0 = 0; j0 < cols; j0 += kLanes) {
    VecF acc[kRows][kVecs] = {};
    const float* panel = kp + (kb + j0) * D;
    for (int64_t d = 0; d < D; ++d) {
      VecF k[kVecs];
      for (int64_t c = 0; c < kVecs; ++c) k[c] = loadv(panel + d * kLanes + c * kWidth);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kVecs; ++c) acc[r][c] += q[r * D + d] * k[c];
    }
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kVecs; ++c) storev(s + r * kBlockKeys + j0 + c * kWidth, acc[r][c]);
  }
}

// o[r] = o[r] * alpha[r] + sum_j p[r][j] v[kb + j].
void pv_tile(const float* prob, const float* vp, int64_t nkp, int64_t dp, int64_t kb, int64_t keys,
             const float* alpha, float* o) {
  for (int64_t d0 = 0; d0 < dp; d0 += kLanes) {
    const float* panel = vp + d0 * nkp;
    VecF acc[kRows][kVecs];
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kVecs; ++c)
        acc[r][c] = loadv(o + r * dp + d0 + c * kWidth) * alpha[r];
    for (int64_t j = 0; j < keys; ++j) {
      VecF v[kVecs];
      for (int64_t c = 0; c < kVecs; ++c) v[c] = loadv(panel + (kb + j) * kLanes + c * kWidth);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kVecs; ++c) acc[r][c] += prob[r * kBlockKeys + j] * v[c];
    }
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kVecs; ++c) storev(o + r * dp + d0 + c * kWidth, acc[r][c]);
  }
}

// Online-softmax update of one row of base-2 scores: turns s[0, len) into probabilities in
// place (2^(s - m_new), zero past `visible` up to len rounded to 16) and returns the factor for
// the old sums. Rows are kBlockKeys (a multiple of 16) long. Only the vector holding the first
// hidden key needs the mask; the others skip it.
float softmax_row(float* s, int64_t len, int64_t visible, float& m, float& l) {
  const int64_t end = round_up(len, kLanes);
  if (visible == 0) {
    for (int64_t j = 0; j < end; ++j) s[j] = 0.0f;
    return 1.0f;
  }
  for (int64_t j = visible; j < end; ++j) s[j] = kNegInf;
  VecF vmax = splat(kNegInf);
  for (int64_t j = 0; j < end; j += kWidth) {
    const VecF x = loadv(s + j);
    vmax = x > vmax ? x : vmax;
  }
  float mx = kNegInf;
  for (int64_t c = 0; c < kWidth; ++c) mx = max_f(mx, vmax[c]);
  const float m_new = max_f(m, mx);
  const float alpha = m == kNegInf ? 0.0f : exp2_1(m - m_new);
  VecF vsum = {};
  const int64_t unmasked = visible / kWidth * kWidth;
  int64_t j = 0;
  for (; j < unmasked; j += kWidth) {
    const VecF e = exp2v(loadv(s + j) - m_new);
    vsum += e;
    storev(s + j, e);
  }
  for (; j < end; j += kWidth) {
    const VecF x = loadv(s + j);
    VecF e = exp2v(x - m_new);
    e = x == kNegInf ? VecF{} : e;
    vsum += e;
    storev(s + j, e);
  }
  float sum = 0.0f;
  for (int64_t c = 0; c < kWidth; ++c) sum += vsum[c];
  m = m_new;
  l = l * alpha + sum;
  return alpha;
}

void attend(const Problem& p, int64_t b, int64_t h, int64_t row_begin, int64_t row_end,
            const void* packed, void* scratch) {
  F32Layout lay(p);
  const int64_t D = p.head_dim, rows = row_end - row_begin;
  Arena in{static_cast<uint8_t*>(const_cast<void*>(packed))};
  const float* kp = in.take<float>(D * lay.nkp);
  const float* vp = in.take<float>(lay.nkp * lay.dp);
  Arena arena{static_cast<uint8_t*>(scratch)};
  float* q = arena.take<float>(kBlockRows * D);
  float* o = arena.take<float>(kBlockRows * lay.dp);
  float* s = arena.take<float>(kRows * kBlockKeys);
  float* m = arena.take<float>(kBlockRows);
  float* l = arena.take<float>(kBlockRows);
  float* alpha = arena.take<float>(kRows);

  const int64_t padded_rows = round_up(rows, kRows);
  // Queries carry the softmax scale and log2(e), so scores come out in base 2.
  const float q_scale = p.scale * kLog2e;
  for (int64_t r = 0; r < padded_rows; ++r) {
    const int64_t qo = offset(p.q_stride, b, h, row_begin + r);
    for (int64_t d = 0; d < D; ++d)
      q[r * D + d] = r < rows ? load_elem(p, p.q, qo + d) * q_scale : 0.0f;
    for (int64_t d = 0; d < lay.dp; ++d) o[r * lay.dp + d] = 0.0f;
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  // Causal: no key past the block's last row is visible to any of its rows.
  const int64_t key_end = p.causal ? min_i64(p.nk, row_end) : p.nk;
  for (int64_t kb = 0; kb < key_end; kb += kBlockKeys) {
    const int64_t len = min_i64(kBlockKeys, p.nk - kb);
    for (int64_t r0 = 0; r0 < padded_rows; r0 += kRows) {
      qk_tile(q + r0 * D, D, kp, kb, round_up(len, kLanes), s);
      for (int64_t r = 0; r < kRows; ++r) {
        const int64_t row = row_begin + r0 + r;
        const int64_t visible = r0 + r < rows ? visible_keys(p, row, kb, len) : 0;
        alpha[r] = softmax_row(s + r * kBlockKeys, len, visible, m[r0 + r], l[r0 + r]);
      }
      pv_tile(s, vp, lay.nkp, lay.dp, kb, len, alpha, o + r0 * lay.dp);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / l[r];
    const int64_t oo = offset(p.out_stride, b, h, row_begin + r);
    if (p.bf16) {
      uint16_t* out = static_cast<uint16_t*>(p.out) + oo;
      for (int64_t d = 0; d < D; ++d) out[d] = float_to_bf16(o[r * lay.dp + d] * inv);
    } else {
      float* out = static_cast<float*>(p.out) + oo;
      for (int64_t d = 0; d < D; ++d) out[d] = o[r * lay.dp + d] * inv;
    }
  }
}

const Kernel kKernel = {FLASH_KERNEL_NAME, kBlockRows, packed_bytes, pack, scratch_bytes, attend};

}  // namespace

const Kernel* FLASH_KERNEL_GETTER() {
  return &kKernel;
}

}  // namespace diffuse::nn::flash
