// ControlNetModel (diffusers controlnets/controlnet.py): a copy of the UNet's encoder half
// (time embedding, conv_in, down blocks, mid block) whose input gets a conditioning image's
// embedding added after conv_in, and whose every skip connection and mid output goes through
// a 1x1 "zero convolution"; the results are what the UNet adds to its own skips
// (models::UNetControlResiduals). Built from the ControlNet's config.json; its parameter names
// are diffusers' so that a diffusers ControlNet folder loads by name.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "models/unet2d_condition.h"
#include "nn/layers.h"

namespace diffuse::models {

struct ControlNetConfig {
  UNet2DConditionConfig unet;  // the encoder half (encoder_only)
  std::vector<int64_t> conditioning_embedding_out_channels{16, 32, 96, 256};
  int64_t conditioning_channels = 3;
  bool bgr = false;                     // controlnet_conditioning_channel_order "bgr"
  bool global_pool_conditions = false;  // shuffle-style ControlNets: residuals averaged spatially

  // ConfigError naming the file and key; the conditioning embedding must reach the latent
  // size (2^(levels - 1) = the UNet's VAE factor is checked where both are known).
  static ControlNetConfig from_json(const io::JsonConfig& cfg);
  // The conditioning embedding's downscaling factor: 2^(levels - 1).
  int64_t condition_factor() const;
};

// ControlNetConditioningEmbedding: conv_in 3x3, then per level [3x3 conv, 3x3 stride-2 conv],
// conv_out 3x3; SiLU after every conv but conv_out.
struct ControlNetConditioningEmbeddingImpl : torch::nn::Module {
  ControlNetConditioningEmbeddingImpl(int64_t embedding_channels, int64_t conditioning_channels,
                                      const std::vector<int64_t>& block_out_channels);
  torch::Tensor forward(const torch::Tensor& conditioning);

  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  std::vector<nn::Conv2d> block_list;
};
TORCH_MODULE(ControlNetConditioningEmbedding);

class ControlNetModelImpl : public UNet2DConditionModelImpl {
 public:
  explicit ControlNetModelImpl(ControlNetConfig config);

  // sample [B, in_channels, h, w] (the UNet's latent input), controlnet_cond [B, 3, H, W] in
  // [0, 1] (H, W = h, w times condition_factor()). Residuals multiplied by
  // `conditioning_scale`; guess mode scales residual i by logspace(-1, 0, n + 1)[i] instead
  // (the mid residual by 1), as diffusers does. With `intermediates`: time_embedding, conv_in,
  // controlnet_cond_embedding, down_blocks.i, mid_block. InvalidArgument on malformed inputs.
  UNetControlResiduals forward(const torch::Tensor& sample, const torch::Tensor& timestep,
                               const torch::Tensor& encoder_hidden_states,
                               const torch::Tensor& controlnet_cond, double conditioning_scale,
                               bool guess_mode, Intermediates* intermediates = nullptr,
                               const UNetAddedConditions* added = nullptr);

  const ControlNetConfig& controlnet_config() const { return cn_config_; }
  // The number of residuals it gives (the UNet's skip connections of the same layout).
  size_t num_down_residuals() const { return controlnet_down_list.size(); }

  ControlNetConditioningEmbedding controlnet_cond_embedding{nullptr};
  torch::nn::ModuleList controlnet_down_blocks{nullptr};
  std::vector<nn::Conv2d> controlnet_down_list;
  nn::Conv2d controlnet_mid_block{nullptr};

 private:
  ControlNetConfig cn_config_;
};
TORCH_MODULE(ControlNetModel);

// Guess mode's factors for n down residuals and the mid one: float32 logspace(-1, 0, n + 1)
// times `conditioning_scale`, as diffusers computes them. [n + 1] on `device`.
torch::Tensor guess_mode_scales(int64_t n, double conditioning_scale,
                                torch::Device device = torch::kCPU);

// The configuration of a ControlNet folder (or of a pipeline folder's controlnet/), read
// without its weights; nullopt for a single-file checkpoint (its configuration comes from the
// UNet). IoError / ConfigError naming the file.
std::optional<ControlNetConfig> read_controlnet_config(const std::string& path);

// The weights file a ControlNet at `path` (as load_controlnet takes it) loads from: for plans,
// which read its headers only. IoError naming the path when there is none.
std::string controlnet_weights_path(const std::string& path);

// Loads a ControlNet from `path`: a diffusers ControlNet folder (config.json and its
// safetensors weights), a pipeline folder whose model_index.json lists a `controlnet`
// component, or an original ControlNet checkpoint file (*.safetensors with control_model.*
// keys, as lllyasviel's), whose configuration is the UNet's it steers (`unet`, required for a
// file: heads and the like are not in the weights) with what the weights say (channels, the
// conditioning embedding). IoError / ConfigError / FormatError naming the path otherwise.
ControlNetModel load_controlnet(const std::string& path, torch::Device device, torch::Dtype dtype,
                                const UNet2DConditionConfig* unet = nullptr);

}  // namespace diffuse::models
