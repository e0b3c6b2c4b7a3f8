// ResNet block and resamplers shared by the UNet and the VAE (diffusers resnet.py,
// downsampling.py, upsampling.py). Registered names equal diffusers' attribute names.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <optional>
#include <vector>

#include "nn/activations.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"

namespace diffuse::nn {

// How the time embedding enters a ResnetBlock2D (diffusers' resnet_time_scale_shift).
enum class TimeEmbeddingNorm { kDefault, kScaleShift };

struct ResnetBlock2DOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;   // 0 = in_channels
  int64_t temb_channels = 0;  // 0 = no time embedding (VAE)
  int64_t groups = 32;
  int64_t groups_out = 0;  // 0 = groups
  double eps = 1e-6;
  Activation act = Activation::kSilu;
  double output_scale_factor = 1.0;
  TimeEmbeddingNorm time_embedding_norm = TimeEmbeddingNorm::kDefault;
};

// norm1 -> act -> conv1 (+ time_emb_proj(act(temb))) -> norm2 -> act -> conv2, plus the
// (1x1 conv_shortcut when channels change) input, divided by output_scale_factor.
struct ResnetBlock2DImpl : torch::nn::Module {
  explicit ResnetBlock2DImpl(const ResnetBlock2DOptions& options);
  // temb: [B, temb_channels], or an undefined tensor when the block has no time embedding.
  // Pass `input` as an rvalue where the caller is done with it: its memory is then reused.
  torch::Tensor forward(torch::Tensor input, const torch::Tensor& temb = {});

  ResnetBlock2DOptions options;
  GroupNorm norm1{nullptr}, norm2{nullptr};
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};
  nn::Linear time_emb_proj{nullptr};
};
TORCH_MODULE(ResnetBlock2D);

// Stride-2 3x3 conv ("conv"); padding 0 means diffusers' asymmetric (0,1,0,1) zero pad first.
// Without a conv it is a 2x2 average pool (no weights).
struct Downsample2DImpl : torch::nn::Module {
  Downsample2DImpl(int64_t channels, bool use_conv, int64_t out_channels, int64_t padding);
  torch::Tensor forward(const torch::Tensor& x);

  int64_t channels;
  bool use_conv;
  int64_t padding;
  nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Downsample2D);

// Nearest-neighbour 2x upsampling (or to `output_size`), then an optional 3x3 conv ("conv").
struct Upsample2DImpl : torch::nn::Module {
  Upsample2DImpl(int64_t channels, bool use_conv, int64_t out_channels);
  // `x` by value: a moved-in input is freed before the conv.
  torch::Tensor forward(torch::Tensor x,
                        std::optional<std::vector<int64_t>> output_size = std::nullopt);

  int64_t channels;
  nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Upsample2D);

}  // namespace diffuse::nn
