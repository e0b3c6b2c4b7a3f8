#include "quant/quantized_weight.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "diffuse/errors.h"

namespace diffuse::quant {

std::optional<GgmlType> parse_weight_type(const std::string& value, const std::string& flag) {
  if (value == "none") return std::nullopt;
  if (value == "q8_0") return GgmlType::Q8_0;
  if (value == "q4_0") return GgmlType::Q4_0;
  std::string why;
  if (value == "int8")
    why = " (q8_0 is the int8 format: 8-bit values with a scale per 32)";
  else if (value == "fp8")
    why = " (fp8 needs LibTorch's float8 types, 2.1 and later; not in this build)";
  throw InvalidArgument(flag + " '" + value + "': expected none, q8_0 or q4_0" + why);
}

bool dequantizes_on_device(GgmlType type) {
  return type == GgmlType::Q8_0 || type == GgmlType::Q4_0;
}

bool can_keep_quantized(GgmlType type, int64_t cols) {
  const auto& t = ggml_type_traits(type);
  return t.quantized && cols > 0 && cols % t.block_elems == 0;
}

QuantizedWeight quantize_weight(const at::Tensor& weight, GgmlType type, const std::string& name) {
  const auto& traits = ggml_type_traits(type);
  if (weight.dim() != 2)
    throw InvalidArgument("quantize " + name + ": a " + std::to_string(weight.dim()) +
                          "-D tensor; only matrices are kept quantized");
  if (!can_quantize(type) || !traits.quantized)
    throw InvalidArgument(std::string("quantize ") + name + ": cannot quantize to " + traits.name +
                          " (q8_0 and q4_0 can)");
  const int64_t rows = weight.size(0), cols = weight.size(1);
  if (!can_keep_quantized(type, cols))
    throw InvalidArgument("quantize " + name + ": rows of " + std::to_string(cols) +
                          " values are not whole " + traits.name + " blocks of " +
                          std::to_string(traits.block_elems));
  const auto plain = weight.detach().to(at::kCPU, at::kFloat).contiguous();
  const int64_t row_bytes = ggml_row_bytes(type, cols);
  auto blocks = at::empty({rows, row_bytes}, at::TensorOptions().dtype(at::kByte));
  const float* src = plain.data_ptr<float>();
  uint8_t* dst = blocks.data_ptr<uint8_t>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) quantize(type, src + r * cols, dst + r * row_bytes, cols);
  });
  return {type, rows, cols, blocks.to(weight.device())};
}

QuantizedWeight quantized_from_blocks(const at::Tensor& bytes, GgmlType type, int64_t rows,
                                      int64_t cols, const std::string& name) {
  const auto& traits = ggml_type_traits(type);
  if (!traits.quantized || rows <= 0 || cols <= 0 || cols % traits.block_elems != 0)
    throw FormatError(name + ": a " + std::to_string(rows) + "x" + std::to_string(cols) + " " +
                      traits.name + " matrix cannot be kept in blocks");
  const int64_t row_bytes = ggml_row_bytes(type, cols);
  if (bytes.scalar_type() != at::kByte || bytes.numel() != rows * row_bytes)
    throw FormatError(name + ": " + std::to_string(bytes.numel()) + " bytes of " + traits.name +
                      " blocks, expected " + std::to_string(rows * row_bytes) + " for " +
                      std::to_string(rows) + "x" + std::to_string(cols));
  return {type, rows, cols, bytes.reshape({rows, row_bytes}).contiguous()};
}

namespace {

// [n, block_bytes] blocks' leading fp16 scale as float32 [n, 1].
at::Tensor block_scales(const at::Tensor& b) {
  return b.narrow(1, 0, 2).contiguous().view(at::kHalf).to(at::kFloat);
}

// Q8_0: a fp16 scale d and 32 int8 values q; y = q * d.
at::Tensor dequantize_q8_0(const at::Tensor& b) {
  const auto q = b.narrow(1, 2, 32).contiguous().view(at::kChar).to(at::kFloat);
  return q * block_scales(b);
}

// Q4_0: a fp16 scale d and 16 bytes; y[j] = ((byte j & 15) - 8) * d, y[j + 16] = ((byte j >> 4)
// - 8) * d.
at::Tensor dequantize_q4_0(const at::Tensor& b) {
  const auto qs = b.narrow(1, 2, 16);
  const auto lo = qs.bitwise_and(15).to(at::kFloat).sub_(8);
  const auto hi = qs.__rshift__(4).to(at::kFloat).sub_(8);
  return at::cat({lo, hi}, 1) * block_scales(b);
}

}  // namespace

at::Tensor dequantize_weight(const QuantizedWeight& w, at::ScalarType dtype) {
  const auto& traits = ggml_type_traits(w.type);
  const int64_t n_blocks = w.rows * (w.cols / traits.block_elems);
  if (dequantizes_on_device(w.type)) {
    const auto b = w.blocks.view({n_blocks, traits.block_bytes});
    auto values = w.type == GgmlType::Q8_0 ? dequantize_q8_0(b) : dequantize_q4_0(b);
    return values.view({w.rows, w.cols}).to(dtype);
  }
  if (!w.blocks.device().is_cpu())
    throw InvalidArgument(std::string("a ") + traits.name +
                          " weight dequantizes on the CPU only; load it dequantized elsewhere");
  auto out = at::empty({w.rows, w.cols}, at::TensorOptions().dtype(at::kFloat));
  const uint8_t* src = w.blocks.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const int64_t row_bytes = w.blocks.size(1);
  at::parallel_for(0, w.rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      dequantize(w.type, src + r * row_bytes, dst + r * w.cols, w.cols);
  });
  return out.to(dtype);
}

}  // namespace diffuse::quant
