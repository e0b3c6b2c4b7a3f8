// Implementation of CpuKernels on GCC/Clang vector types of the target's native width;
// included by cpu_kernels_{portable,avx2,avx512}.cpp, each defining CPU_KERNELS_NAME and
// CPU_KERNELS_GETTER. Everything here has internal linkage.
#include <cmath>
#include <cstring>

#include "nn/kernels/cpu_kernels.h"
#include "nn/kernels/vec_math.h"
#include "nn/kernels/winograd_impl.h"

namespace diffuse::nn::kernels {
namespace {

using vec::bf16_to_float;
using vec::expv;
using vec::float_to_bf16;
using vec::splat;
using vec::VecF;
using vec::VecH;
using vec::VecI;
using vec::VecU;
constexpr int64_t W = vec::kVecWidth;  // floats per vector

inline VecF load_bf16(const uint16_t* p) {
  VecH h;
  std::memcpy(&h, p, sizeof h);
  VecU u = __builtin_convertvector(h, VecU) << 16;
  VecF f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline void store_bf16(uint16_t* p, VecF f) {
  VecU u;
  std::memcpy(&u, &f, sizeof u);
  VecU r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  r = f != f ? VecU{} + 0x7fc0u : r;
  VecH h = __builtin_convertvector(r, VecH);
  std::memcpy(p, &h, sizeof h);
}

inline VecF silu(VecF y) {
  return y / (1.0f + expv(-y));
}

// erf(x) to 1.5e-7 (Abramowitz & Stegun 7.1.26).
inline VecF erfv(VecF x) {
  const VecF ax = x < 0.0f ? -x : x;
  const VecF t = 1.0f / (1.0f + 0.3275911f * ax);
  VecF p = splat(1.061405429f);
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const VecF y = 1.0f - p * t * expv(-ax * ax);
  return x < 0.0f ? -y : y;
}

inline VecF gelu(VecF x) {
  return 0.5f * x * (1.0f + erfv(x * 0.70710678118654752f));
}

// Applies f to n bf16 values of x (and y2 when binary), writing bf16; the tail goes through a
// zero-padded vector.
template <typename F>
inline void map_bf16(const uint16_t* x, int64_t n, uint16_t* y, F f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store_bf16(y + i, f(load_bf16(x + i)));
  if (i < n) {
    uint16_t in[W] = {}, out[W];
    std::memcpy(in, x + i, sizeof(uint16_t) * (n - i));
    store_bf16(out, f(load_bf16(in)));
    std::memcpy(y + i, out, sizeof(uint16_t) * (n - i));
  }
}

float hsum(VecF v) {
  float s = 0;
  for (int64_t c = 0; c < W; ++c) s += v[c];
  return s;
}

void moments(const uint16_t* x, int64_t n, double* mean_out, double* var_out) {
  if (n <= 0) {
    *mean_out = 0;
    *var_out = 0;
    return;
  }
  // Shifted sums (by the first value) in float32 lanes over blocks of 4096, totals in double:
  // no cancellation when the mean is large, little rounding for long groups.
  const float shift = bf16_to_float(x[0]);
  double s1 = 0, s2 = 0;
  constexpr int64_t kBlock = 4096;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t end = b0 + kBlock < n ? b0 + kBlock : n;
    VecF a1 = {}, a2 = {};
    int64_t i = b0;
    for (; i + W <= end; i += W) {
      const VecF d = load_bf16(x + i) - shift;
      a1 += d;
      a2 += d * d;
    }
    float t1 = hsum(a1), t2 = hsum(a2);
    for (; i < end; ++i) {
      const float d = bf16_to_float(x[i]) - shift;
      t1 += d;
      t2 += d * d;
    }
    s1 += t1;
    s2 += t2;
  }
  const double m = s1 / static_cast<double>(n);
  *mean_out = shift + m;
  const double v = s2 / static_cast<double>(n) - m * m;
  *var_out = v > 0 ? v : 0;
}

void scale_shift(const uint16_t* x, int64_t n, float scale, float shift, bool act, uint16_t* y) {
  if (act)
    map_bf16(x, n, y, [&](VecF v) { return silu(v * scale + shift); });
  else
    map_bf16(x, n, y, [&](VecF v) { return v * scale + shift; });
}

void layer_norm_row(const uint16_t* x, int64_t d, const float* w, const float* b, float eps,
                    uint16_t* y) {
  double mean, var;
  moments(x, d, &mean, &var);
  const float rstd = static_cast<float>(1.0 / __builtin_sqrt(var + eps));
  const float m = static_cast<float>(mean);
  int64_t i = 0;
  for (; i + W <= d; i += W) {
    VecF v = (load_bf16(x + i) - m) * rstd;
    if (w) {
      VecF wv;
      std::memcpy(&wv, w + i, sizeof wv);
      v *= wv;
    }
    if (b) {
      VecF bv;
      std::memcpy(&bv, b + i, sizeof bv);
      v += bv;
    }
    store_bf16(y + i, v);
  }
  for (; i < d; ++i) {
    float v = (bf16_to_float(x[i]) - m) * rstd;
    if (w) v *= w[i];
    if (b) v += b[i];
    y[i] = float_to_bf16(v);
  }
}

// W floats of an optional float32 array from i on (zero when p is null).
inline VecF load_f32(const float* p, int64_t i) {
  VecF v = {};
  if (p) std::memcpy(&v, p + i, sizeof v);
  return v;
}

// The same for the last n - i < W values, zero past n.
inline VecF load_f32_tail(const float* p, int64_t i, int64_t n) {
  VecF v = {};
  if (p) std::memcpy(&v, p + i, sizeof(float) * (n - i));
  return v;
}

// Element access for the kernels that take bf16 or float32 storage (always float32 math).
inline VecF load_elems(const uint16_t* p) {
  return load_bf16(p);
}
inline VecF load_elems(const float* p) {
  return load_f32(p, 0);
}
inline void store_elems(uint16_t* p, VecF f) {
  store_bf16(p, f);
}
inline void store_elems(float* p, VecF f) {
  std::memcpy(p, &f, sizeof f);
}

template <typename T>
void geglu(const T* a, const T* g, int64_t n, const float* a_bias, const float* g_bias, T* y) {
  int64_t i = 0;
  for (; i + W <= n; i += W)
    store_elems(y + i, (load_elems(a + i) + load_f32(a_bias, i)) *
                           gelu(load_elems(g + i) + load_f32(g_bias, i)));
  if (i < n) {
    T ia[W] = {}, ig[W] = {}, out[W];
    std::memcpy(ia, a + i, sizeof(T) * (n - i));
    std::memcpy(ig, g + i, sizeof(T) * (n - i));
    store_elems(out, (load_elems(ia) + load_f32_tail(a_bias, i, n)) *
                         gelu(load_elems(ig) + load_f32_tail(g_bias, i, n)));
    std::memcpy(y + i, out, sizeof(T) * (n - i));
  }
}

void add_bias_residual(uint16_t* y, const float* bias, const uint16_t* residual, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W)
    store_bf16(y + i, load_bf16(y + i) + load_f32(bias, i) + load_bf16(residual + i));
  if (i < n) {
    uint16_t iy[W] = {}, ir[W] = {}, out[W];
    std::memcpy(iy, y + i, sizeof(uint16_t) * (n - i));
    std::memcpy(ir, residual + i, sizeof(uint16_t) * (n - i));
    store_bf16(out, load_bf16(iy) + load_f32_tail(bias, i, n) + load_bf16(ir));
    std::memcpy(y + i, out, sizeof(uint16_t) * (n - i));
  }
}

void channel_sums(const uint16_t* x, int64_t pixels, int64_t C, const float* shift, float* scratch,
                  double* s1, double* s2) {
  float* a1 = scratch;
  float* a2 = scratch + C;
  constexpr int64_t kBlock = 512;
  for (int64_t p0 = 0; p0 < pixels; p0 += kBlock) {
    const int64_t p1 = p0 + kBlock < pixels ? p0 + kBlock : pixels;
    for (int64_t c = 0; c < C; ++c) a1[c] = a2[c] = 0.0f;
    for (int64_t p = p0; p < p1; ++p) {
      const uint16_t* row = x + p * C;
      int64_t c = 0;
      for (; c + W <= C; c += W) {
        VecF sh, v1, v2;
        std::memcpy(&sh, shift + c, sizeof sh);
        std::memcpy(&v1, a1 + c, sizeof v1);
        std::memcpy(&v2, a2 + c, sizeof v2);
        const VecF d = load_bf16(row + c) - sh;
        v1 += d;
        v2 += d * d;
        std::memcpy(a1 + c, &v1, sizeof v1);
        std::memcpy(a2 + c, &v2, sizeof v2);
      }
      for (; c < C; ++c) {
        const float d = bf16_to_float(row[c]) - shift[c];
        a1[c] += d;
        a2[c] += d * d;
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      s1[c] += a1[c];
      s2[c] += a2[c];
    }
  }
}

void channel_scale_shift(const uint16_t* x, int64_t pixels, int64_t C, const float* scale,
                         const float* shift, bool act, uint16_t* y) {
  for (int64_t p = 0; p < pixels; ++p) {
    const uint16_t* in = x + p * C;
    uint16_t* out = y + p * C;
    int64_t c = 0;
    for (; c + W <= C; c += W) {
      VecF a, b;
      std::memcpy(&a, scale + c, sizeof a);
      std::memcpy(&b, shift + c, sizeof b);
      const VecF v = load_bf16(in + c) * a + b;
      store_bf16(out + c, act ? silu(v) : v);
    }
    for (; c < C; ++c) {
      float v = bf16_to_float(in[c]) * scale[c] + shift[c];
      if (act) v = v / (1.0f + __builtin_expf(-v));
      out[c] = float_to_bf16(v);
    }
  }
}

inline float elem_to_float(uint16_t h) {
  return bf16_to_float(h);
}
inline float elem_to_float(float f) {
  return f;
}
inline uint16_t float_to_elem(float f, const uint16_t*) {
  return float_to_bf16(f);
}
inline float float_to_elem(float f, const float*) {
  return f;
}

// Rounds |v| <= 2^22 to the nearest integer, half to even, as std::nearbyint does in the
// default rounding mode: the ISA's rounding instruction, or without one adding and subtracting
// 1.5 * 2^23 (no fraction bits left). Not the addition where FMA exists: the compiler would fuse
// the caller's product into it and round the exact product instead of the float32 one.
inline VecF round_even(VecF v) {
#if defined(__SSE4_1__) || defined(__AVX__)
  return vec::roundv(v);
#else
  const VecF magic = splat(12582912.0f);
  return (v + magic) - magic;
#endif
}

template <typename T>
float quantize_row_u8(const T* x, int64_t n, uint8_t* q) {
  typedef uint8_t VecB __attribute__((vector_size(W)));
  VecF m = {}, probe = {};
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const VecF v = load_elems(x + i);
    const VecF a = v < 0.0f ? -v : v;
    m = a > m ? a : m;
    probe += v * 0.0f;  // stays 0 unless a value is NaN or infinite (times 0: NaN)
  }
  bool finite = !__builtin_isnan(hsum(probe));
  float amax = 0;
  for (int j = 0; j < W; ++j) amax = m[j] > amax ? m[j] : amax;
  for (int64_t j = i; j < n; ++j) {
    const float v = elem_to_float(x[j]);
    finite = finite && __builtin_isfinite(v);
    const float a = v < 0 ? -v : v;
    amax = a > amax ? a : amax;
  }
  if (!finite) return __builtin_nanf("");
  if (!(amax > 0)) {
    std::memset(q, 128, static_cast<size_t>(n));
    return 0;
  }
  const float inv = 127.0f / amax;
  for (i = 0; i + W <= n; i += W) {
    const VecF r = round_even(load_elems(x + i) * inv) + 128.0f;
    const VecB b = __builtin_convertvector(__builtin_convertvector(r, VecI), VecB);
    std::memcpy(q + i, &b, sizeof b);
  }
  for (; i < n; ++i)
    q[i] = static_cast<uint8_t>(static_cast<int>(__builtin_nearbyintf(elem_to_float(x[i]) * inv)) +
                                128);
  return amax / 127.0f;
}

template <typename T>
void int8_dequantize_row(const int32_t* acc, int64_t n, float sx, const float* sw,
                         const float* bias, const T* residual, T* y) {
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    VecI a;
    std::memcpy(&a, acc + j, sizeof a);
    VecF v = __builtin_convertvector(a, VecF) * (load_f32(sw, j) * sx) + load_f32(bias, j);
    if (residual) v += load_elems(residual + j);
    store_elems(y + j, v);
  }
  for (; j < n; ++j) {
    float v = static_cast<float>(acc[j]) * (sw[j] * sx) + (bias ? bias[j] : 0.0f);
    if (residual) v += elem_to_float(residual[j]);
    y[j] = float_to_elem(v, y);
  }
}

const CpuKernels kKernels = {CPU_KERNELS_NAME,
                             moments,
                             scale_shift,
                             layer_norm_row,
                             geglu<uint16_t>,
                             geglu<float>,
                             add_bias_residual,
                             quantize_row_u8<uint16_t>,
                             quantize_row_u8<float>,
                             int8_dequantize_row<uint16_t>,
                             int8_dequantize_row<float>,
                             channel_sums,
                             channel_scale_shift,
                             winograd_weights,
                             winograd4_weights,
                             winograd_input,
                             winograd4_input,
                             winograd_output,
                             winograd4_output};

}  // namespace

const CpuKernels* CPU_KERNELS_GETTER() {
  return &kKernels;
}

}  // namespace diffuse::nn::kernels
