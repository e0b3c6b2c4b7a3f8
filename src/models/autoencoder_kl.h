// AutoencoderKL (diffusers autoencoders/autoencoder_kl.py), built from its config.json.
// encode() returns the diagonal Gaussian posterior; decode() maps latents to images. Neither
// applies scaling_factor / shift_factor: the pipeline does (latents = sf * (z - shift)).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/types.h>

#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "io/model_folder.h"
#include "models/intermediates.h"
#include "models/vae.h"
#include "nn/layers.h"

namespace diffuse::models {

struct AutoencoderKLConfig {
  std::string source;  // the config file, for messages
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<std::string> down_block_types;
  std::vector<std::string> up_block_types;
  std::vector<int64_t> block_out_channels;
  int64_t layers_per_block = 1;
  std::string act_fn = "silu";
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  std::vector<int64_t> sample_size;  // [] absent, [s] square, or [h, w]
  double scaling_factor = 0.18215;
  std::optional<double> shift_factor;
  bool force_upcast = true;  // the VAE should run in float32 even when the rest is half precision
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;

  // Parses and validates; ConfigError naming the file, key and value on any problem.
  static AutoencoderKLConfig from_json(const io::JsonConfig& cfg);
  // Image pixels per latent pixel along each axis: 2^(number of blocks - 1).
  int64_t spatial_factor() const;
  // The latents a denoiser works on from the VAE's z and back: latents = (z - shift) * scale
  // (shift 0 without shift_factor, as SD's VAEs; the Flux-style VAEs of HiDream have one).
  torch::Tensor to_latents(const torch::Tensor& z) const;
  torch::Tensor from_latents(const torch::Tensor& latents) const;
};

// DiagonalGaussianDistribution: mean and logvar are the channel halves of the moments,
// logvar clamped to [-30, 20], std = exp(0.5 * logvar).
struct LatentDist {
  torch::Tensor mean, logvar, std;
  // From the encoder's moments [B, 2 * latent_channels, h, w] (after quant_conv).
  static LatentDist from_moments(const torch::Tensor& moments);
  // mean + std * noise (noise drawn by the caller, e.g. on the CPU for reproducibility).
  torch::Tensor sample(const torch::Tensor& noise) const {
    return mean + std * noise.to(mean.options());
  }
};

class AutoencoderKLImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLImpl(AutoencoderKLConfig config);

  // x: [B, in_channels, H, W] in [-1, 1], H and W multiples of spatial_factor().
  // With `intermediates`, records encoder.{conv_in, down_blocks.i, mid_block, conv_norm_out,
  // conv_out} and quant_conv. InvalidArgument on malformed input. Inputs of encode and decode
  // are converted to the weights' device and dtype; results have that dtype.
  LatentDist encode(const torch::Tensor& x, Intermediates* intermediates = nullptr);
  // The posterior's moments (encoder, then quant_conv) that encode() splits.
  torch::Tensor encode_moments(const torch::Tensor& x, Intermediates* intermediates = nullptr);
  // z: [B, latent_channels, h, w] (unscaled) -> [B, out_channels, h * f, w * f], not clamped.
  // Records post_quant_conv and decoder.{conv_in, mid_block, up_blocks.i, conv_norm_out, conv_out}.
  torch::Tensor decode(const torch::Tensor& z, Intermediates* intermediates = nullptr);

  const AutoencoderKLConfig& config() const { return config_; }

  Encoder encoder{nullptr};
  Decoder decoder{nullptr};
  nn::Conv2d quant_conv{nullptr}, post_quant_conv{nullptr};

 private:
  AutoencoderKLConfig config_;
};
TORCH_MODULE(AutoencoderKL);

// Builds the model from `<component>/config.json`, loads its weights by name, and moves it to
// `device` / `dtype` in eval mode. ConfigError / FormatError / IoError name the file.
AutoencoderKL load_vae(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype,
                       const std::string& component = "vae");

}  // namespace diffuse::models
