// AutoencoderKLQwenImage (diffusers autoencoders/autoencoder_kl_qwenimage.py, the Wan-2.1 style
// causal 3D VAE of Qwen-Image), run on single images: the first frame of a causal convolution
// sees only zero padding before it, so every 3D convolution is a 2D one with its last used time
// tap, and the temporal resampling convolutions (skipped for the first frame by the reference)
// never run. Module names and weight shapes are diffusers' (5D convolution weights), so its
// vae/ folder loads by name. The pipelines normalise latents per channel with latents_mean /
// latents_std instead of one scaling factor.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "io/json_config.h"
#include "models/autoencoder_kl.h"

namespace diffuse::io {
class ModelFolder;
}

namespace diffuse::models {

struct AutoencoderKLQwenImageConfig {
  std::string source;
  int64_t base_dim = 96;
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult{1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<double> attn_scales;
  std::vector<bool> temperal_downsample{false, true, true};
  int64_t input_channels = 3;
  std::vector<float> latents_mean, latents_std;  // z_dim values each

  static AutoencoderKLQwenImageConfig from_json(const io::JsonConfig& cfg);
  // Pixels per latent pixel: 2^(number of down-sampling stages).
  int64_t spatial_factor() const { return int64_t{1} << (dim_mult.size() - 1); }
  // (z - latents_mean) / latents_std per channel, and back; z [B, z_dim, h, w].
  torch::Tensor to_latents(const torch::Tensor& z) const;
  torch::Tensor from_latents(const torch::Tensor& latents) const;
};

class AutoencoderKLQwenImageImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLQwenImageImpl(AutoencoderKLQwenImageConfig config);

  // x [B, 3, H, W] in [-1, 1] (one frame; H, W multiples of spatial_factor()) -> the posterior
  // (mean, logvar clamped to [-30, 20], std) of z [B, z_dim, H/f, W/f].
  LatentDist encode(const torch::Tensor& x);
  // z [B, z_dim, h, w] -> image [B, 3, h*f, w*f], not clamped.
  torch::Tensor decode(const torch::Tensor& z);

  const AutoencoderKLQwenImageConfig& config() const { return config_; }

  // The layers in run order (conv_in, down/up blocks, mid block, norm_out + SiLU, conv_out).
  struct Layer;

 private:
  AutoencoderKLQwenImageConfig config_;
  std::vector<std::shared_ptr<Layer>> encoder_, decoder_;
  std::shared_ptr<Layer> quant_conv_, post_quant_conv_;
};
TORCH_MODULE(AutoencoderKLQwenImage);

// Whether `<component>/config.json` of the folder is an AutoencoderKLQwenImage.
bool is_qwenimage_vae(const io::ModelFolder& folder, const std::string& component = "vae");
AutoencoderKLQwenImage load_qwenimage_vae(const io::ModelFolder& folder, torch::Device device,
                                          torch::Dtype dtype, const std::string& component = "vae");

}  // namespace diffuse::models
