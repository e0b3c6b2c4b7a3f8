// `diffuse quantize`: a model's weights written as a GGUF file in one of ggml's types, for
// diffuse and for the other tools that read GGUF (stable-diffusion.cpp, ComfyUI-GGUF).
// A diffusers folder gives one component (by default its denoiser: transformer, else unet) with
// diffusers names; a single-file checkpoint keeps its own (LDM) names, as
// stable-diffusion.cpp's all-in-one files do.
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "quant/ggml_blocks.h"

namespace diffuse::quant {

struct QuantizeOptions {
  std::string model;      // a diffusers folder or a single weights file
  std::string component;  // folder only; empty: "transformer" if present, else "unet"
  std::string type = "q8_0";
  std::string out;  // the .gguf file to write
};

struct QuantizeReport {
  std::string component;  // what was written ("" for a single file)
  int tensors = 0;
  int quantized = 0;      // stored in the block type; the rest keep their float type
  int64_t bytes_in = 0;   // the source tensors' bytes
  int64_t bytes_out = 0;  // the file's size
};

// Matrices (2 or more dimensions) whose rows are whole blocks of the type are quantized; 1-D
// tensors and others keep their float type (F32/F16/BF16; integer buffers become F32). For the
// plain types (f32, f16, bf16) every float tensor is converted. InvalidArgument for a type that
// cannot be written or an output that is not a *.gguf path, before anything is read.
QuantizeReport quantize_model(const QuantizeOptions& options);

// How a tensor of `dtype` and `shape` is stored in a GGUF written in `type` (the rule above):
// `type` for floating matrices whose rows are whole blocks (every float tensor for a plain
// type), else its own float type (F32 for integers).
GgmlType gguf_storage_type(c10::ScalarType dtype, bool floating, const std::vector<int64_t>& shape,
                           GgmlType type);

}  // namespace diffuse::quant
