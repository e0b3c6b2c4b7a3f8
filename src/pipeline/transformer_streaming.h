// The choice of transformer weight streaming (models/block_streaming.h) that the DiT pipelines
// (HiDream, FLUX) share: the mode a user names, what it excludes, and when "auto" streams.
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
// "auto": whether weight files of `file_bytes` need more than 80 % of the memory available on
// `device` (MemAvailable on the CPU), so that the transformer streams instead of not fitting.
bool streaming_pays(int64_t file_bytes, const torch::Device& device);

}  // namespace diffuse::pipeline
