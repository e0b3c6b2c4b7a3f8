#include "pipeline/transformer_streaming.h"

#include "diffuse/errors.h"

namespace diffuse::pipeline {

void check_weight_streaming_mode(const std::string& mode, const std::string& current, bool loaded,
                                 const std::optional<quant::GgmlType>& weight_type) {
  if (mode != "auto" && mode != "on" && mode != "off")
    throw InvalidArgument("weight streaming: expected auto, on or off, got '" + mode + "'");
  if (loaded && mode != current)
    throw InvalidArgument("weight streaming is chosen before the transformer loads");
  if (mode == "on" && weight_type)
    throw InvalidArgument(
        "weight streaming and quantized weights exclude each other: streaming reads the plain "
        "weights from their files at every step");
}

void check_weight_type_change(const std::string& type, const std::optional<quant::GgmlType>& parsed,
                              const std::optional<quant::GgmlType>& current, bool loaded,
                              const std::string& streaming) {
  if (loaded && parsed != current)
    throw InvalidArgument("the weight type is chosen before the transformer loads");
  if (parsed && streaming == "on")
    throw InvalidArgument("quantized weights (" + type +
                          ") and weight streaming exclude each other: streaming reads the plain "
                          "weights from their files at every step");
}

}  // namespace diffuse::pipeline
