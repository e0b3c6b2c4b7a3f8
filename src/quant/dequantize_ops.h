// The device path of quant::dequantize_weight, exposed for tests that check it against the
// CPU kernel on a machine without an accelerator.
#pragma once
#include <ATen/core/Tensor.h>

#include "quant/quantized_weight.h"

namespace diffuse::quant {

// Q8_0/Q4_0 blocks dequantized by tensor operations wherever they are (what CUDA and NPU run):
// the fp16 scale widened, one float32 product per value, then `dtype`. InvalidArgument for
// other types.
at::Tensor dequantize_by_tensor_ops(const QuantizedWeight& w, at::ScalarType dtype);

}  // namespace diffuse::quant
