#include "quant/quantized_weight.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "diffuse/errors.h"
#include "quant/dequantize_ops.h"

namespace diffuse::quant {

std::optional<GgmlType> parse_weight_type(const std::string& value, const std::string& flag) {
  if (value == "none") return std::nullopt;
  if (value == "q8_0") return GgmlType::Q8_0;
  if (value == "q4_0") return GgmlType::Q4_0;
  if (value == "int8") return GgmlType::I8_ROWS;
  const std::string why =
      value == "fp8" ? " (fp8 needs LibTorch's float8 types, 2.1 and later; not in this build)"
                     : "";
  throw InvalidArgument(flag + " '" + value + "': expected none, q8_0, q4_0 or int8" + why);
}

std::string weight_type_name(GgmlType type) {
  return type == GgmlType::I8_ROWS ? "int8" : ggml_type_traits(type).name;
}

bool dequantizes_on_device(GgmlType type) {
  return type == GgmlType::Q8_0 || type == GgmlType::Q4_0 || type == GgmlType::I8_ROWS;
}

namespace {

// The largest |value| of a row, or infinity when one is not finite (NaN compares false).
float row_amax(const float* x, int64_t n) {
  float amax = 0;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    finite &= a <= std::numeric_limits<float>::max();
    amax = std::max(amax, a);
  }
  return finite ? amax : std::numeric_limits<float>::infinity();
}

// Calls fn(rows, r0, r1) for rows [r0, r1) of `weight` converted to float32 on the CPU, a few
// at a time, in a buffer each thread reuses, so that quantizing a layer allocates only what it
// keeps. Whole-matrix temporaries (~20 bytes a value for int8's tensor arithmetic) raised a SD2.1
// UNet's load peak above its bf16 size; per-chunk ones (~9 MB for int8) still landed between the
// blocks kept, in whichever hole of the heap fit them: over HiDream-I1's 1,128 layers, quantized
// from bf16, those freed and resident holes grew to ~0.43 bytes per byte kept (out of memory at
// 23 GiB for 16.9 GiB of int8; 17.8 GiB at the peak without them).
template <typename Fn>
void for_float_row_chunks(const at::Tensor& weight, Fn&& fn) {
  const int64_t rows = weight.size(0), cols = weight.size(1);
  const int64_t chunk = std::max<int64_t>(16, (int64_t{1} << 20) / std::max<int64_t>(cols, 1));
  thread_local std::vector<float> scratch;
  const auto need = static_cast<size_t>(std::min(chunk, rows) * cols);
  if (scratch.size() < need) scratch.resize(need);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r1 = std::min(rows, r0 + chunk);
    at::from_blob(scratch.data(), {r1 - r0, cols}, at::kFloat)
        .copy_(weight.detach().slice(0, r0, r1));
    fn(static_cast<const float*>(scratch.data()), r0, r1);
  }
}

// For each row r of `rows` in parallel, fn(r, amax of that row); NumericalError naming the
// weight when a row holds a value that is not finite.
template <typename Fn>
void for_checked_rows(const float* rows, int64_t r0, int64_t r1, int64_t cols,
                      const std::string& name, Fn&& fn) {
  std::atomic<bool> finite{true};
  at::parallel_for(r0, r1, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float amax = row_amax(rows + (r - r0) * cols, cols);
      if (amax == std::numeric_limits<float>::infinity()) {
        finite = false;
        return;
      }
      fn(r, amax);
    }
  });
  if (!finite)
    throw NumericalError("quantize " + name + ": holds values that are not finite (NaN/Inf)");
}

// Symmetric per-row int8 (I8_ROWS), computed in float32 on the CPU.
QuantizedWeight quantize_int8_rows(const at::Tensor& weight, const std::string& name) {
  const int64_t rows = weight.size(0), cols = weight.size(1);
  auto codes = at::empty({rows, cols}, at::kChar);
  auto scales = at::empty({rows}, at::kFloat);
  int8_t* q = codes.data_ptr<int8_t>();
  float* s = scales.data_ptr<float>();
  for_float_row_chunks(weight, [&](const float* plain, int64_t r0, int64_t r1) {
    for_checked_rows(plain, r0, r1, cols, name, [&](int64_t r, float amax) {
      const float scale = amax / 127.0f;
      // A zero row divides by 1 (its codes are 0 and its scale stays 0).
      const float divisor = amax > 0 ? scale : 1.0f;
      const float* x = plain + (r - r0) * cols;
      int8_t* out = q + r * cols;
      for (int64_t c = 0; c < cols; ++c)
        out[c] = static_cast<int8_t>(std::clamp(std::nearbyint(x[c] / divisor), -127.0f, 127.0f));
      s[r] = scale;
    });
  });
  const auto device = weight.device();
  return {GgmlType::I8_ROWS, rows, cols, codes.view(at::kByte).to(device), scales.to(device)};
}

}  // namespace

bool can_keep_quantized(GgmlType type, int64_t cols) {
  const auto& t = ggml_type_traits(type);
  return t.quantized && cols > 0 && cols % t.block_elems == 0;
}

QuantizedWeight quantize_weight(const at::Tensor& weight, GgmlType type, const std::string& name) {
  const auto& traits = ggml_type_traits(type);
  if (weight.dim() != 2)
    throw InvalidArgument("quantize " + name + ": a " + std::to_string(weight.dim()) +
                          "-D tensor; only matrices are kept quantized");
  if (type == GgmlType::I8_ROWS) return quantize_int8_rows(weight, name);
  if (!can_quantize(type) || !traits.quantized)
    throw InvalidArgument(std::string("quantize ") + name + ": cannot quantize to " + traits.name +
                          " (q8_0, q4_0 and int8 can)");
  const int64_t rows = weight.size(0), cols = weight.size(1);
  if (!can_keep_quantized(type, cols))
    throw InvalidArgument("quantize " + name + ": rows of " + std::to_string(cols) +
                          " values are not whole " + traits.name + " blocks of " +
                          std::to_string(traits.block_elems));
  const int64_t row_bytes = ggml_row_bytes(type, cols);
  auto blocks = at::empty({rows, row_bytes}, at::kByte);
  uint8_t* dst = blocks.data_ptr<uint8_t>();
  for_float_row_chunks(weight, [&](const float* plain, int64_t r0, int64_t r1) {
    for_checked_rows(plain, r0, r1, cols, name, [&](int64_t r, float) {
      quantize(type, plain + (r - r0) * cols, dst + r * row_bytes, cols);
    });
  });
  return {type, rows, cols, blocks.to(weight.device()), {}};
}

QuantizedWeight quantized_from_blocks(const at::Tensor& bytes, GgmlType type, int64_t rows,
                                      int64_t cols, const std::string& name) {
  const auto& traits = ggml_type_traits(type);
  if (type == GgmlType::I8_ROWS)
    throw FormatError(name + ": int8 rows are made in memory (--weights int8), not read as blocks");
  if (!traits.quantized || rows <= 0 || cols <= 0 || cols % traits.block_elems != 0)
    throw FormatError(name + ": a " + std::to_string(rows) + "x" + std::to_string(cols) + " " +
                      traits.name + " matrix cannot be kept in blocks");
  const int64_t row_bytes = ggml_row_bytes(type, cols);
  if (bytes.scalar_type() != at::kByte || bytes.numel() != rows * row_bytes)
    throw FormatError(name + ": " + std::to_string(bytes.numel()) + " bytes of " + traits.name +
                      " blocks, expected " + std::to_string(rows * row_bytes) + " for " +
                      std::to_string(rows) + "x" + std::to_string(cols));
  return {type, rows, cols, bytes.reshape({rows, row_bytes}).contiguous(), {}};
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

// Q8_0/Q4_0 on the CPU in one pass, straight into T: each value is the float32 product ggml's
// reference computes, rounded once to T as Tensor::to does (c10's conversions), so the result
// equals the tensor-operation path bit for bit at a fraction of its memory traffic (that path
// makes three float32 temporaries of the whole weight; it made a q8_0 single-stream block of
// HiDream-I1 1.9x slower than bf16 on 2 cores).
template <typename T>
void dequantize_rows(const QuantizedWeight& w, T* out) {
  const auto& traits = ggml_type_traits(w.type);
  const int64_t per_row = w.cols / traits.block_elems, row_bytes = w.blocks.size(1);
  const uint8_t* src = w.blocks.data_ptr<uint8_t>();
  const bool q8 = w.type == GgmlType::Q8_0;
  at::parallel_for(0, w.rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t b = 0; b < per_row; ++b) {
        const uint8_t* block = src + r * row_bytes + b * traits.block_bytes;
        uint16_t bits;
        std::memcpy(&bits, block, 2);
        const float d = c10::detail::fp16_ieee_to_fp32_value(bits);
        T* y = out + r * w.cols + b * 32;
        if (q8) {
          const auto* q = reinterpret_cast<const int8_t*>(block + 2);
          for (int j = 0; j < 32; ++j) y[j] = static_cast<T>(static_cast<float>(q[j]) * d);
        } else {
          const uint8_t* q = block + 2;
          for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<T>(static_cast<float>((q[j] & 0x0F) - 8) * d);
            y[j + 16] = static_cast<T>(static_cast<float>((q[j] >> 4) - 8) * d);
          }
        }
      }
    }
  });
}

}  // namespace

at::Tensor dequantize_by_tensor_ops(const QuantizedWeight& w, at::ScalarType dtype) {
  const auto& traits = ggml_type_traits(w.type);
  if (!dequantizes_on_device(w.type))
    throw InvalidArgument(std::string("dequantize_by_tensor_ops: not for ") + traits.name);
  if (w.type == GgmlType::I8_ROWS)
    return (w.blocks.view(at::kChar).to(at::kFloat) * w.row_scales.unsqueeze(1)).to(dtype);
  const int64_t n_blocks = w.rows * (w.cols / traits.block_elems);
  const auto b = w.blocks.view({n_blocks, traits.block_bytes});
  auto values = w.type == GgmlType::Q8_0 ? dequantize_q8_0(b) : dequantize_q4_0(b);
  return values.view({w.rows, w.cols}).to(dtype);
}

namespace {

// Whether the one-pass CPU dequantizer (dequantize_rows) serves `w` into `dtype`.
bool dequantizes_on_cpu_in_one_pass(const QuantizedWeight& w, at::ScalarType dtype) {
  const bool rows_ok = w.type != GgmlType::I8_ROWS ||
                       (w.row_scales.defined() && w.row_scales.device().is_cpu() &&
                        w.row_scales.scalar_type() == at::kFloat && w.row_scales.is_contiguous());
  return dequantizes_on_device(w.type) && rows_ok && w.blocks.device().is_cpu() &&
         w.blocks.is_contiguous() &&
         (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
}

// I8_ROWS: each int8 code times its row's float32 scale, rounded once to T (the tensor-operation
// path's float32 product and conversion, bit for bit).
template <typename T>
void dequantize_int8_rows(const QuantizedWeight& w, T* out) {
  const auto* codes = reinterpret_cast<const int8_t*>(w.blocks.data_ptr<uint8_t>());
  const float* scales = w.row_scales.data_ptr<float>();
  at::parallel_for(0, w.rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float s = scales[r];
      const int8_t* q = codes + r * w.cols;
      T* y = out + r * w.cols;
      for (int64_t c = 0; c < w.cols; ++c) y[c] = static_cast<T>(static_cast<float>(q[c]) * s);
    }
  });
}

template <typename T>
void dequantize_into(const QuantizedWeight& w, T* out) {
  if (w.type == GgmlType::I8_ROWS)
    dequantize_int8_rows(w, out);
  else
    dequantize_rows(w, out);
}

void dequantize_rows_into(const QuantizedWeight& w, at::Tensor& out) {
  if (out.scalar_type() == at::kFloat)
    dequantize_into(w, out.data_ptr<float>());
  else if (out.scalar_type() == at::kBFloat16)
    dequantize_into(w, out.data_ptr<at::BFloat16>());
  else
    dequantize_into(w, out.data_ptr<at::Half>());
}

}  // namespace

at::Tensor dequantize_weight(const QuantizedWeight& w, at::ScalarType dtype) {
  const auto& traits = ggml_type_traits(w.type);
  if (dequantizes_on_device(w.type)) {
    if (!dequantizes_on_cpu_in_one_pass(w, dtype)) return dequantize_by_tensor_ops(w, dtype);
    auto out = at::empty({w.rows, w.cols}, at::TensorOptions().dtype(dtype));
    dequantize_rows_into(w, out);
    return out;
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

at::Tensor dequantize_weight_for_call(const QuantizedWeight& w, at::ScalarType dtype) {
  if (!dequantizes_on_cpu_in_one_pass(w, dtype)) return dequantize_weight(w, dtype);
  // One buffer per thread, grown to the largest weight it has held: a 17B transformer's layers
  // differ in size, and a fresh buffer per call left holes of every size in the heap that
  // activations then split (the heap keeps freed memory, see device::keep_freed_memory).
  thread_local at::Tensor buffer;
  const int64_t bytes = w.rows * w.cols * static_cast<int64_t>(c10::elementSize(dtype));
  if (!buffer.defined() || buffer.numel() < bytes) {
    buffer = at::Tensor();  // the old one goes back first
    buffer = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  }
  auto out = buffer.narrow(0, 0, bytes).view(dtype).view({w.rows, w.cols});
  dequantize_rows_into(w, out);
  return out;
}

}  // namespace diffuse::quant
