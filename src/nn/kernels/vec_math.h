// Float vector math shared by the per-ISA CPU kernels (fused norms and GEGLU in
// nn/kernels, flash attention in nn/attention): GCC/Clang vector types of the target's native
// width, a fast exp and bf16 conversions. Everything has internal linkage (anonymous
// namespace): each including translation unit is compiled for its own instruction set and
// must keep its own copy, or the linker could hand an AVX-512 body to the portable kernels.
#pragma once
#include <cstdint>
#include <cstring>
#if defined(__AVX__) || defined(__SSE4_1__)
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics build their "undefined" operands with a self-initialised local
// (`__m512 __Y = __Y;`), which -Wmaybe-uninitialized reports at every inlined use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace diffuse::nn::vec {
namespace {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
constexpr int64_t kVecWidth = kVecBytes / 4;  // floats per vector
typedef float VecF __attribute__((vector_size(kVecBytes)));
typedef int32_t VecI __attribute__((vector_size(kVecBytes)));
typedef uint32_t VecU __attribute__((vector_size(kVecBytes)));
typedef uint16_t VecH __attribute__((vector_size(kVecBytes / 2)));

inline VecF splat(float x) {
  return VecF{} + x;
}

// max(lo, min(x, hi)) per lane; a NaN stays NaN. One instruction each where the ISA has them
// (the comparison-and-blend GCC makes of the generic form is two).
inline VecF clampv(VecF x, float lo, float hi) {
#if defined(__AVX512F__)
  return (VecF)_mm512_max_ps(_mm512_set1_ps(lo), _mm512_min_ps(_mm512_set1_ps(hi), (__m512)x));
#elif defined(__AVX__)
  return (VecF)_mm256_max_ps(_mm256_set1_ps(lo), _mm256_min_ps(_mm256_set1_ps(hi), (__m256)x));
#elif defined(__SSE4_1__)
  return (VecF)_mm_max_ps(_mm_set1_ps(lo), _mm_min_ps(_mm_set1_ps(hi), (__m128)x));
#else
  x = x < lo ? splat(lo) : x;
  return x > hi ? splat(hi) : x;
#endif
}

// floor() per lane, for |y| < 2^31: one rounding instruction where the ISA has it (three
// otherwise: truncate, convert back, correct the negatives).
inline VecF floorv(VecF y) {
#if defined(__AVX512F__)
  return (VecF)_mm512_roundscale_ps((__m512)y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
#elif defined(__AVX__)
  return (VecF)_mm256_round_ps((__m256)y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
#elif defined(__SSE4_1__)
  return (VecF)_mm_round_ps((__m128)y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
#else
  const VecF n = __builtin_convertvector(__builtin_convertvector(y, VecI), VecF);
  return n > y ? n - 1.0f : n;
#endif
}

// A nearest integer per lane, for |y| < 2^22: one instruction where the ISA has it.
inline VecF roundv(VecF y) {
#if defined(__AVX512F__)
  return (VecF)_mm512_roundscale_ps((__m512)y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__AVX__)
  return (VecF)_mm256_round_ps((__m256)y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__SSE4_1__)
  return (VecF)_mm_round_ps((__m128)y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  return floorv(y + 0.5f);
#endif
}

// 2^n for integer-valued lanes n in [-126, 127], built in the exponent bits.
inline VecF pow2n(VecF n) {
  const VecI bits = (__builtin_convertvector(n, VecI) + 127) << 23;
  VecF out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// exp(x) to ~2 ulp for x in [-87, 88] (clamped outside): Cephes' polynomial on
// [-ln2/2, ln2/2], 2^n built in the exponent bits.
inline VecF expv(VecF x) {
  x = clampv(x, -87.0f, 88.0f);
  const VecF y = x * 1.44269504088896341f + 0.5f;
  const VecF n = floorv(y);
  VecF r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  VecF p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * pow2n(n);
}

// 2^x to ~2 ulp for x in [-126, 127] (clamped outside): with x = n + f, n = round(x), a
// degree-6 polynomial of 2^f on [-1/2, 1/2] (interpolated at Chebyshev nodes), evaluated
// Estrin-style. Its dependency chain is about half of expv's: the flash kernels' softmax takes
// one per score on scores already scaled by log2(e), and there the chain sets the pace.
inline VecF exp2v(VecF x) {
  x = clampv(x, -126.0f, 127.0f);
  const VecF n = roundv(x);
  const VecF f = x - n, f2 = f * f;
  const VecF a = f * 6.931471825e-1f + 1.0f;
  const VecF b = f * 5.550327152e-2f + 2.402265072e-1f;
  const VecF c = f * 1.340042800e-3f + 9.618056938e-3f;
  const VecF p = ((f2 * 1.546144485e-4f + c) * f2 + b) * f2 + a;
  return p * pow2n(n);
}

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as c10::BFloat16 does; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace
}  // namespace diffuse::nn::vec
