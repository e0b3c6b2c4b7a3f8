// Weights kept quantized in memory: a linear layer's [out, in] matrix in one of ggml's block
// formats, dequantized for each call into the input's dtype (nn::LinearImpl::quantized), so
// that only one layer's plain weight exists at a time. The blocks live on the layer's device.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "quant/ggml_blocks.h"

namespace diffuse::quant {

struct QuantizedWeight {
  GgmlType type = GgmlType::Q8_0;
  int64_t rows = 0, cols = 0;  // the plain weight's [out, in]
  at::Tensor blocks;           // uint8 [rows, ggml_row_bytes(type, cols)], contiguous
  // I8_ROWS only: float32 [rows], the scale of each row (value = int8 code * scale); `blocks`
  // then holds the int8 codes. Undefined for ggml's types, whose blocks carry their scales.
  at::Tensor row_scales;
  int64_t bytes() const {
    return (blocks.defined() ? blocks.numel() : 0) +
           (row_scales.defined() ? row_scales.numel() * 4 : 0);
  }
};

// Whether a matrix of `cols` columns can be kept in `type`: a quantized type whose rows are
// whole blocks and that dequantize_weight runs (see there).
bool can_keep_quantized(GgmlType type, int64_t cols);

// `weight` ([rows, cols], any float dtype, any device) through ggml's reference quantizer
// (Q8_0, Q4_0: what quant::quantize writes), or for I8_ROWS symmetrically per row (scale =
// max|row| / 127, codes round(w / scale) in [-127, 127], half to even; a row of zeros has scale
// 0), in float32 on the CPU; the blocks go to the weight's device. NumericalError naming the
// weight for a value that is not finite.
// InvalidArgument when can_keep_quantized is false or the weight is not a matrix.
QuantizedWeight quantize_weight(const at::Tensor& weight, GgmlType type, const std::string& name);

// Blocks read from a file (uint8, rows * ggml_row_bytes(type, cols) bytes, e.g. a GGUF
// tensor's data) kept as they are. FormatError naming `name` when the size disagrees.
QuantizedWeight quantized_from_blocks(const at::Tensor& bytes, GgmlType type, int64_t rows,
                                      int64_t cols, const std::string& name);

// The plain [rows, cols] weight in `dtype`, on the blocks' device. Q8_0 and Q4_0 dequantize by
// tensor operations wherever the blocks are (CPU, CUDA, NPU): the fp16 scale widened and one
// float32 product per value, as ggml's reference does, so the values are bit-identical to
// quant::dequantize. The other types run ggml's reference dequantizer on the CPU (blocks on
// another device are refused by can_keep_quantized's caller: they dequantize at load).
at::Tensor dequantize_weight(const QuantizedWeight& w, at::ScalarType dtype);
// The same values for one layer call: on the CPU (Q8_0, Q4_0 and I8_ROWS into float32, bf16 or
// fp16)
// they go into a buffer this thread reuses, so the result is valid only until the thread's next
// call; elsewhere (another device or type) a tensor of its own, as dequantize_weight.
at::Tensor dequantize_weight_for_call(const QuantizedWeight& w, at::ScalarType dtype);

// The value of a --weights flag: "none" (plain weights: nullopt), "q8_0", "q4_0" or "int8"
// (I8_ROWS) (the types a layer can be quantized to at load; a GGUF file's own types load as they
// are stored).
// InvalidArgument naming `flag` and the accepted values otherwise.
std::optional<GgmlType> parse_weight_type(const std::string& value, const std::string& flag);
// The name parse_weight_type reads for `type` ("q8_0", "q4_0", "int8").
std::string weight_type_name(GgmlType type);

// Whether `type` dequantizes by tensor operations (on any device).
bool dequantizes_on_device(GgmlType type);

}  // namespace diffuse::quant
