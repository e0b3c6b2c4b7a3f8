// The choice of transformer weight streaming (models/block_streaming.h) that the DiT pipelines
// (HiDream, FLUX, Qwen-Image) share: the mode a user names and what it excludes ("auto" streams
// when the memory plan says so: pipeline/memory_plan.h).
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "quant/quantized_weight.h"

namespace diffuse::pipeline {

// The checks of set_weight_streaming(mode): InvalidArgument for a word other than auto, on or
// off, for a change once the transformer is `loaded`, and for "on" with quantized weights.
void check_weight_streaming_mode(const std::string& mode, const std::string& current, bool loaded,
                                 const std::optional<quant::GgmlType>& weight_type);
// The checks of set_weight_type(type) against the streaming mode: InvalidArgument for a change
// once loaded, and for quantized weights while streaming is "on".
void check_weight_type_change(const std::string& type, const std::optional<quant::GgmlType>& parsed,
                              const std::optional<quant::GgmlType>& current, bool loaded,
                              const std::string& streaming);

}  // namespace diffuse::pipeline
