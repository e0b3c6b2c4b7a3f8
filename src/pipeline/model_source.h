// Where a pipeline's parts come from: a diffusers folder or a single-file checkpoint, reduced
// to the same thing — a config per component, a state dict per component (diffusers names)
// and a tokenizer folder — so the pipeline has one loading path.
#pragma once
#include <torch/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "io/unet_file.h"

namespace diffuse::pipeline {

// A CLIP text encoder and its tokenizer: "text_encoder" (SD 1.x/2.x; SDXL's CLIP-L) or
// "text_encoder_2" (SDXL's CLIP-G, with projection).
struct TextEncoderSource {
  std::string component;  // "text_encoder" | "text_encoder_2"
  io::JsonConfig config;
  std::string tokenizer_dir;
  std::map<std::string, torch::Tensor> weights;
  bool with_projection = false;  // CLIPTextModelWithProjection
};

struct ModelSource {
  std::string path;
  std::string kind;  // "diffusers" | "single-file"
  io::JsonConfig unet_config, vae_config, scheduler_config;
  // In the order the pipeline concatenates their outputs: one for SD 1.x/2.x, two for SDXL
  // base, only text_encoder_2 for an SDXL refiner.
  std::vector<TextEncoderSource> text_encoders;
  io::JsonConfig model_index;  // empty for a single file
  std::map<std::string, torch::Tensor> unet_weights, vae_weights;
  // The UNet from a file of its own (ModelSourceOptions::unet_file), read tensor by tensor at
  // load (a GGUF's quantized blocks as stored); unet_weights is then empty.
  std::optional<io::UnetFile> unet_file;
};

struct ModelSourceOptions {
  std::string config_dir;
  std::optional<bool> v_prediction;
  // A UNet file replacing the model's UNet weights (io/unet_file.h: diffusers or LDM names,
  // safetensors or GGUF); the model's unet config must describe it.
  std::string unet_file;
};

// Throws IoError when `path` does not exist, FormatError/ConfigError when it is not a model.
ModelSource open_model_source(const std::string& path, const ModelSourceOptions& options);

// The VAE scale factor a model runs with, from its configs alone (before anything loads): the
// diffusers folder's vae/config.json (or that of `config_dir`, for a single file), else 8 (the
// VAE of every Stable Diffusion 1.x/2.x single-file checkpoint). ConfigError for a malformed
// VAE config.
int vae_scale_factor_of(const std::string& path, const std::string& config_dir);

}  // namespace diffuse::pipeline
