// Helpers shared by the flash kernels. Everything has internal linkage (anonymous namespace):
// each kernel translation unit is compiled for its own instruction set and must keep its own
// copy (see flash_kernel.h).
#pragma once
#include <cstdint>
#include <cstring>

#include "nn/attention/flash_kernel.h"
#include "nn/kernels/vec_math.h"

namespace diffuse::nn::flash {
namespace {

using vec::bf16_to_float;
using vec::float_to_bf16;

constexpr float kNegInf = -__builtin_inff();

inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}
inline int64_t min_i64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
inline int64_t max_i64(int64_t a, int64_t b) {
  return a > b ? a : b;
}
inline float max_f(float a, float b) {
  return a > b ? a : b;
}

// Element `index` of row `token` of (batch b, head h) of a strided [B, H, N, D] tensor.
inline int64_t offset(const int64_t* stride, int64_t b, int64_t h, int64_t token) {
  return b * stride[0] + h * stride[1] + token * stride[2];
}

// Number of keys of the block starting at `kb` (of `len` keys) that query row `row` may see.
inline int64_t visible_keys(const Problem& p, int64_t row, int64_t kb, int64_t len) {
  if (!p.causal) return len;
  return min_i64(max_i64(row - kb + 1, 0), len);
}

// Carves 64-byte aligned pieces out of one scratch buffer.
struct Arena {
  uint8_t* at;
  template <typename T>
  T* take(int64_t count) {
    T* out = reinterpret_cast<T*>(at);
    at += round_up(count * static_cast<int64_t>(sizeof(T)), 64);
    return out;
  }
};

template <typename T>
inline int64_t aligned_bytes(int64_t count) {
  return round_up(count * static_cast<int64_t>(sizeof(T)), 64);
}

// ---- Float32 packing, per (batch, head), zero padded to 16 keys and 16 head dims; each
// float32 kernel arranges the padded K and V its own way.
constexpr int64_t kF32PackLanes = 16;

struct F32Layout {
  int64_t nkp, dp;
  explicit F32Layout(const Problem& p)
      : nkp(round_up(p.nk, kF32PackLanes)), dp(round_up(p.head_dim, kF32PackLanes)) {}
};

inline float load_elem(const Problem& p, const void* base, int64_t index) {
  return p.bf16 ? bf16_to_float(static_cast<const uint16_t*>(base)[index])
                : static_cast<const float*>(base)[index];
}

}  // namespace
}  // namespace diffuse::nn::flash
