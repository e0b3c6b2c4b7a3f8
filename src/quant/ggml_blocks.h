// ggml's tensor types and their block formats, as GGUF files store them (ggml's
// ggml-common.h): plain floats (F32, F16, BF16), the 32-element blocks Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q8_1, and the 256-element k-quant super-blocks Q2_K ... Q8_K. Dequantization follows
// ggml's reference formulas operation for operation (float32, in the same order), so results
// are bit-identical to ggml's dequantize_row_*; quantization implements ggml's reference
// quantizers for Q8_0 and Q4_0 (what `diffuse quantize` writes).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace diffuse::quant {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
  // Not one of ggml's types: diffuse's in-memory int8 weight with one float32 scale per row
  // (quant/quantized_weight.h), which the CPU multiplies in 8-bit integers (nn/int8_linear.h).
  // Never read from or written to a file: ggml_type_traits(uint32_t) and ggml_type_named do
  // not know it, can_quantize is false.
  I8_ROWS = 0x10000,
};

struct GgmlTypeTraits {
  GgmlType type;
  const char* name;     // "q8_0", as ggml names it
  int64_t block_elems;  // elements per block (1 for plain floats)
  int64_t block_bytes;  // bytes per block
  bool quantized;
};

// The traits of a type id read from a file; nullopt for ids this reader does not know (the
// i-quants, ternary types, ...).
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type);
const GgmlTypeTraits& ggml_type_traits(GgmlType type);
// By name, case-insensitive ("q8_0", "Q4_K", "bf16"); nullopt if unknown.
std::optional<GgmlType> ggml_type_named(const std::string& name);

// Bytes that `elements` elements take (elements must be a multiple of the block size).
int64_t ggml_row_bytes(GgmlType type, int64_t elements);

// `elements` values (a multiple of the type's block size) from `src` into float32 `dst`.
void dequantize(GgmlType type, const uint8_t* src, float* dst, int64_t elements);

// ggml's reference quantizer for `type` (F32, F16, BF16, Q8_0, Q4_0): `elements` floats into
// ggml_row_bytes(type, elements) bytes at `dst`. InvalidArgument for other types.
void quantize(GgmlType type, const float* src, uint8_t* dst, int64_t elements);
bool can_quantize(GgmlType type);

}  // namespace diffuse::quant
