// Float vector math shared by the per-ISA CPU kernels (fused norms and GEGLU in
// nn/kernels, flash attention in nn/attention): GCC/Clang vector types of the target's native
// width, a fast exp and bf16 conversions. Everything has internal linkage (anonymous
// namespace): each including translation unit is compiled for its own instruction set and
// must keep its own copy, or the linker could hand an AVX-512 body to the portable kernels.
#pragma once
#include <cstdint>
#include <cstring>

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

// exp(x) to ~2 ulp for x in [-87, 88] (clamped outside): Cephes' polynomial on
// [-ln2/2, ln2/2], 2^n built in the exponent bits.
inline VecF expv(VecF x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  x = x > 88.0f ? splat(88.0f) : x;
  const VecF y = x * 1.44269504088896341f + 0.5f;
  VecF n = __builtin_convertvector(__builtin_convertvector(y, VecI), VecF);
  n = n > y ? n - 1.0f : n;  // truncation -> floor
  VecF r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  VecF p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const VecI bits = (__builtin_convertvector(n, VecI) + 127) << 23;
  VecF scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
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
