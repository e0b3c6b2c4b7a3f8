// The VAE's blocks (diffusers unet_2d_blocks.py: DownEncoderBlock2D, UpDecoderBlock2D,
// UNetMidBlock2D; attention_processor.py: the Attention that UNetMidBlock2D builds with
// group_norm and residual_connection). No time embedding anywhere.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <vector>

#include "nn/layers.h"
#include "nn/resnet.h"

namespace diffuse::nn {

// Self-attention over the H*W positions of a [B, C, H, W] map: group_norm, to_q/to_k/to_v
// (with bias), to_out.0, plus the input (residual), divided by rescale_output_factor.
struct SpatialSelfAttentionImpl : torch::nn::Module {
  SpatialSelfAttentionImpl(int64_t channels, int64_t heads, int64_t norm_groups, double eps,
                           double rescale_output_factor = 1.0);
  torch::Tensor forward(const torch::Tensor& x);

  int64_t channels, heads;
  double rescale_output_factor;
  GroupNorm group_norm{nullptr};
  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, out_proj{nullptr};
  torch::nn::ModuleList to_out{nullptr};
};
TORCH_MODULE(SpatialSelfAttention);

struct VaeBlockOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t num_layers = 1;
  double eps = 1e-6;
  Activation act = Activation::kSilu;
  int64_t groups = 32;
  bool add_resample = false;       // downsampler (encoder) / upsampler (decoder)
  int64_t downsample_padding = 0;  // the encoder pads (0,1,0,1) instead
  bool add_attention = true;       // mid block only
  int64_t attention_head_dim = 0;  // mid block only; 0 = channels (one head)
};

struct DownEncoderBlock2DImpl : torch::nn::Module {
  explicit DownEncoderBlock2DImpl(const VaeBlockOptions& options);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::ModuleList resnets{nullptr}, downsamplers{nullptr};
  std::vector<ResnetBlock2D> resnet_list;
  Downsample2D downsampler{nullptr};
};
TORCH_MODULE(DownEncoderBlock2D);

struct UpDecoderBlock2DImpl : torch::nn::Module {
  explicit UpDecoderBlock2DImpl(const VaeBlockOptions& options);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::ModuleList resnets{nullptr}, upsamplers{nullptr};
  std::vector<ResnetBlock2D> resnet_list;
  Upsample2D upsampler{nullptr};
};
TORCH_MODULE(UpDecoderBlock2D);

// resnets.0, then (attentions.i, resnets.i+1) pairs; in_channels == out_channels.
struct UNetMidBlock2DImpl : torch::nn::Module {
  explicit UNetMidBlock2DImpl(const VaeBlockOptions& options);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::ModuleList resnets{nullptr}, attentions{nullptr};
  std::vector<ResnetBlock2D> resnet_list;
  std::vector<SpatialSelfAttention> attention_list;
};
TORCH_MODULE(UNetMidBlock2D);

}  // namespace diffuse::nn
