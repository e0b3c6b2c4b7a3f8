// A Stable Diffusion UNet in a file of its own (`--unet FILE`: city96's GGUFs, a UNet saved by
// ComfyUI or extracted from a checkpoint, diffusers' own diffusion_pytorch_model file). The
// tensors are named as diffusers names them, or in the original LDM layout
// (io/ldm_checkpoint.h: input_blocks.*, middle_block.*, output_blocks.*, with or without
// "model.diffusion_model."), which is read through a mapping table built from the file's names
// and shapes alone, so that a GGUF's quantized blocks load as stored instead of being
// dequantized first.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/ldm_key_map.h"
#include "io/weight_layout.h"

namespace diffuse::io {

// Every tensor of a safetensors or GGUF file by name, with its shape (PyTorch order); nothing
// is read but the header. IoError/FormatError as the file's reader throws them.
std::map<std::string, std::vector<int64_t>> weight_file_shapes(const std::string& path);

struct UnetFile {
  std::string path;
  std::string naming;                  // "diffusers" | "ldm"
  std::string prefix;                  // the UNet's tensors are those named with it
  std::optional<WeightLayout> layout;  // ldm: each diffusers name's tensor in the file
  std::optional<ldm::UnetLayout> ldm;  // ldm: the structure its names and shapes give
  int64_t parameters = 0;              // elements of every tensor the UNet reads
};

// Reads the file's header and works out its naming. FormatError naming the file when the names
// are neither diffusers' nor LDM's, when an LDM file's structure does not parse (the error names
// the key), or when it holds tensors that are not the UNet's (a whole checkpoint: use it as
// --model instead).
UnetFile open_unet_file(const std::string& path);

// The UNet of a single-file checkpoint (model.diffusion_model.*, io/ldm_checkpoint.h) as such a
// table, for reading it tensor by tensor; the file's other parts are not looked at.
UnetFile unet_in_checkpoint(const std::string& path);

// Checks `config` (the model folder's unet/config.json, named `config_source`) against an LDM
// file's structure on every key its shapes determine (channels, levels, resnets per level,
// attention per level, cross-attention width, linear projections); ConfigError naming the key
// and both values. A diffusers-named file is checked tensor by tensor when it loads.
void check_unet_file_against_config(const UnetFile& file, const nlohmann::json& config,
                                    const std::string& config_source);

}  // namespace diffuse::io
