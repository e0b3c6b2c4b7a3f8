#include "quant/ggml_blocks.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "diffuse/errors.h"

namespace diffuse::quant {
namespace {

constexpr int64_t kQK = 32;    // elements of the small blocks
constexpr int64_t kQKK = 256;  // elements of the k-quant super-blocks

// Sizes as ggml-common.h lays the blocks out (fp16 scales, no padding).
constexpr GgmlTypeTraits kTypes[] = {
    {GgmlType::F32, "f32", 1, 4, false},
    {GgmlType::F16, "f16", 1, 2, false},
    {GgmlType::BF16, "bf16", 1, 2, false},
    {GgmlType::Q4_0, "q4_0", kQK, 2 + kQK / 2, true},
    {GgmlType::Q4_1, "q4_1", kQK, 4 + kQK / 2, true},
    {GgmlType::Q5_0, "q5_0", kQK, 2 + 4 + kQK / 2, true},
    {GgmlType::Q5_1, "q5_1", kQK, 4 + 4 + kQK / 2, true},
    {GgmlType::Q8_0, "q8_0", kQK, 2 + kQK, true},
    {GgmlType::Q8_1, "q8_1", kQK, 4 + kQK, true},
    {GgmlType::Q2_K, "q2_k", kQKK, kQKK / 16 + kQKK / 4 + 4, true},
    {GgmlType::Q3_K, "q3_k", kQKK, kQKK / 8 + kQKK / 4 + 12 + 2, true},
    {GgmlType::Q4_K, "q4_k", kQKK, 4 + 12 + kQKK / 2, true},
    {GgmlType::Q5_K, "q5_k", kQKK, 4 + 12 + kQKK / 8 + kQKK / 2, true},
    {GgmlType::Q6_K, "q6_k", kQKK, kQKK / 2 + kQKK / 4 + kQKK / 16 + 2, true},
    {GgmlType::Q8_K, "q8_k", kQKK, 4 + kQKK + kQKK / 16 * 2, true},
};

// One int8 per element; its rows' scales live beside the values (QuantizedWeight::row_scales).
constexpr GgmlTypeTraits kInt8Rows = {GgmlType::I8_ROWS, "int8", 1, 1, true};

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

void put_half(uint8_t* p, float v) {
  const uint16_t bits = c10::detail::fp16_ieee_from_fp32_value(v);
  std::memcpy(p, &bits, 2);
}

// 6-bit scale and min j of the 12-byte packed table of Q4_K and Q5_K (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// 6-bit scale `is` (0..15) of Q3_K's 12-byte packed table: low 4 bits from the first 8 bytes,
// high 2 bits from the last 4.
int q3k_scale(const uint8_t* s, int is) {
  int us;
  if (is < 4)
    us = (s[is] & 0xF) | (((s[is + 8] >> 0) & 3) << 4);
  else if (is < 8)
    us = (s[is] & 0xF) | (((s[is + 4] >> 2) & 3) << 4);
  else if (is < 12)
    us = (s[is - 8] >> 4) | (((s[is] >> 4) & 3) << 4);
  else
    us = (s[is - 8] >> 4) | (((s[is - 4] >> 6) & 3) << 4);
  return us - 32;
}

void dequantize_block(GgmlType type, const uint8_t* b, float* y) {
  switch (type) {
    case GgmlType::Q4_0: {
      const float d = half_at(b);
      const uint8_t* qs = b + 2;
      for (int j = 0; j < kQK / 2; ++j) {
        const int x0 = (qs[j] & 0x0F) - 8, x1 = (qs[j] >> 4) - 8;
        y[j] = static_cast<float>(x0) * d;
        y[j + kQK / 2] = static_cast<float>(x1) * d;
      }
      return;
    }
    case GgmlType::Q4_1: {
      const float d = half_at(b), m = half_at(b + 2);
      const uint8_t* qs = b + 4;
      for (int j = 0; j < kQK / 2; ++j) {
        const int x0 = qs[j] & 0x0F, x1 = qs[j] >> 4;
        y[j] = static_cast<float>(x0) * d + m;
        y[j + kQK / 2] = static_cast<float>(x1) * d + m;
      }
      return;
    }
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      const bool with_min = type == GgmlType::Q5_1;
      const float d = half_at(b), m = with_min ? half_at(b + 2) : 0.0f;
      const uint8_t* p = b + (with_min ? 4 : 2);
      uint32_t qh;
      std::memcpy(&qh, p, 4);
      const uint8_t* qs = p + 4;
      for (int j = 0; j < kQK / 2; ++j) {
        const uint8_t xh_0 = static_cast<uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
        const uint8_t xh_1 = static_cast<uint8_t>(((qh >> (j + 12))) & 0x10);
        const int x0 = (qs[j] & 0x0F) | xh_0, x1 = (qs[j] >> 4) | xh_1;
        if (with_min) {
          y[j] = static_cast<float>(x0) * d + m;
          y[j + kQK / 2] = static_cast<float>(x1) * d + m;
        } else {
          y[j] = static_cast<float>(x0 - 16) * d;
          y[j + kQK / 2] = static_cast<float>(x1 - 16) * d;
        }
      }
      return;
    }
    case GgmlType::Q8_0:
    case GgmlType::Q8_1: {
      const float d = half_at(b);
      const auto* qs = reinterpret_cast<const int8_t*>(b + (type == GgmlType::Q8_0 ? 2 : 4));
      for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(qs[j]) * d;
      return;
    }
    case GgmlType::Q2_K: {
      const uint8_t* scales = b;
      const uint8_t* q = b + kQKK / 16;
      const float d = half_at(b + kQKK / 16 + kQKK / 4),
                  min = half_at(b + kQKK / 16 + kQKK / 4 + 2);
      int is = 0;
      for (int n = 0; n < kQKK; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
          for (int half = 0; half < 2; ++half) {
            const uint8_t sc = scales[is++];
            const float dl = d * static_cast<float>(sc & 0xF),
                        ml = min * static_cast<float>(sc >> 4);
            for (int l = 0; l < 16; ++l)
              *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 16 * half] >> shift) & 3)) -
                     ml;
          }
          shift += 2;
        }
        q += 32;
      }
      return;
    }
    case GgmlType::Q3_K: {
      const uint8_t* hm = b;
      const uint8_t* q = b + kQKK / 8;
      const uint8_t* scales = q + kQKK / 4;
      const float d_all = half_at(scales + 12);
      int is = 0;
      uint8_t m = 1;
      for (int n = 0; n < kQKK; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
          for (int half = 0; half < 2; ++half) {
            const float dl = d_all * static_cast<float>(q3k_scale(scales, is++));
            for (int l = 16 * half; l < 16 * half + 16; ++l)
              *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l] >> shift) & 3) -
                                             ((hm[l] & m) ? 0 : 4));
          }
          shift += 2;
          m = static_cast<uint8_t>(m << 1);
        }
        q += 32;
      }
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool five = type == GgmlType::Q5_K;
      const float d = half_at(b), min = half_at(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* ql = b + 16 + (five ? kQKK / 8 : 0);
      int is = 0;
      uint8_t u1 = 1, u2 = 2;
      for (int j = 0; j < kQKK; j += 64) {
        uint8_t sc, mm;
        scale_min_k4(is + 0, scales, &sc, &mm);
        const float d1 = d * sc, m1 = min * mm;
        scale_min_k4(is + 1, scales, &sc, &mm);
        const float d2 = d * sc, m2 = min * mm;
        for (int l = 0; l < 32; ++l) {
          const int hi = five && (qh[l] & u1) ? 16 : 0;
          *y++ = d1 * static_cast<float>((ql[l] & 0xF) + hi) - m1;
        }
        for (int l = 0; l < 32; ++l) {
          const int hi = five && (qh[l] & u2) ? 16 : 0;
          *y++ = d2 * static_cast<float>((ql[l] >> 4) + hi) - m2;
        }
        ql += 32;
        is += 2;
        u1 = static_cast<uint8_t>(u1 << 2);
        u2 = static_cast<uint8_t>(u2 << 2);
      }
      return;
    }
    case GgmlType::Q6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + kQKK / 2;
      const auto* sc = reinterpret_cast<const int8_t*>(b + kQKK / 2 + kQKK / 4);
      const float d = half_at(b + kQKK / 2 + kQKK / 4 + kQKK / 16);
      for (int n = 0; n < kQKK; n += 128) {
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int8_t q1 =
              static_cast<int8_t>(((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
          const int8_t q2 =
              static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
          const int8_t q3 =
              static_cast<int8_t>(((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
          const int8_t q4 =
              static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
          y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
          y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
          y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
          y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
      }
      return;
    }
    case GgmlType::Q8_K: {
      float d;
      std::memcpy(&d, b, 4);
      const auto* qs = reinterpret_cast<const int8_t*>(b + 4);
      for (int j = 0; j < kQKK; ++j) y[j] = d * static_cast<float>(qs[j]);
      return;
    }
    default:
      throw InvalidArgument(std::string("dequantize: ") + ggml_type_traits(type).name +
                            " is not a block type");
  }
}

// ggml's quantize_row_q8_0_ref for one block.
void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / ((1 << 7) - 1);
  const float id = d ? 1.0f / d : 0.0f;
  put_half(b, d);
  auto* qs = reinterpret_cast<int8_t*>(b + 2);
  for (int j = 0; j < kQK; ++j) qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
}

// ggml's quantize_row_q4_0_ref for one block: the scale maps the value of largest magnitude,
// sign included, to -8.
void quantize_q4_0(const float* x, uint8_t* b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8;
  const float id = d ? 1.0f / d : 0.0f;
  put_half(b, d);
  uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    const float x0 = x[j] * id, x1 = x[kQK / 2 + j] * id;
    const uint8_t xi0 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x0 + 8.5f)));
    const uint8_t xi1 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x1 + 8.5f)));
    qs[j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
  }
}

void require_whole_blocks(const GgmlTypeTraits& t, int64_t elements, const char* what) {
  if (elements < 0 || elements % t.block_elems != 0)
    throw InvalidArgument(std::string(what) + ": " + std::to_string(elements) +
                          " elements are not whole " + t.name + " blocks of " +
                          std::to_string(t.block_elems));
}

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == type) return t;
  return std::nullopt;
}

const GgmlTypeTraits& ggml_type_traits(GgmlType type) {
  if (type == GgmlType::I8_ROWS) return kInt8Rows;
  for (const auto& t : kTypes)
    if (t.type == type) return t;
  throw InvalidArgument("ggml type " + std::to_string(static_cast<uint32_t>(type)) + " is unknown");
}

std::optional<GgmlType> ggml_type_named(const std::string& name) {
  std::string lower = name;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& t : kTypes)
    if (lower == t.name) return t.type;
  return std::nullopt;
}

int64_t ggml_row_bytes(GgmlType type, int64_t elements) {
  const auto& t = ggml_type_traits(type);
  require_whole_blocks(t, elements, "ggml_row_bytes");
  return elements / t.block_elems * t.block_bytes;
}

void dequantize(GgmlType type, const uint8_t* src, float* dst, int64_t elements) {
  const auto& t = ggml_type_traits(type);
  require_whole_blocks(t, elements, "dequantize");
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(elements) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < elements; ++i) dst[i] = half_at(src + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < elements; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = c10::detail::f32_from_bits(bits);
      }
      return;
    default:
      for (int64_t i = 0; i < elements / t.block_elems; ++i)
        dequantize_block(type, src + i * t.block_bytes, dst + i * t.block_elems);
  }
}

bool can_quantize(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16 ||
         type == GgmlType::Q8_0 || type == GgmlType::Q4_0;
}

void quantize(GgmlType type, const float* src, uint8_t* dst, int64_t elements) {
  const auto& t = ggml_type_traits(type);
  if (!can_quantize(type))
    throw InvalidArgument(std::string("quantize: writing ") + t.name +
                          " is not supported (f32, f16, bf16, q8_0 and q4_0 are)");
  require_whole_blocks(t, elements, "quantize");
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(elements) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < elements; ++i) put_half(dst + 2 * i, src[i]);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < elements; ++i) {
        const uint16_t bits = c10::detail::round_to_nearest_even(src[i]);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
      return;
    case GgmlType::Q8_0:
      for (int64_t i = 0; i < elements / kQK; ++i)
        quantize_q8_0(src + i * kQK, dst + i * t.block_bytes);
      return;
    default:  // Q4_0
      for (int64_t i = 0; i < elements / kQK; ++i)
        quantize_q4_0(src + i * kQK, dst + i * t.block_bytes);
  }
}

}  // namespace diffuse::quant
