// The UNet's down, mid and up blocks (diffusers unets/unet_2d_blocks.py): CrossAttnDownBlock2D,
// DownBlock2D, UNetMidBlock2DCrossAttn, UpBlock2D, CrossAttnUpBlock2D. One options struct
// covers them all; blocks without attention ignore the attention fields.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <optional>
#include <vector>

#include "nn/resnet.h"
#include "nn/transformer_2d.h"

namespace diffuse::nn {

struct UNetBlockOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t prev_output_channel = 0;  // up blocks: channels coming from the block below
  int64_t temb_channels = 0;
  int64_t num_layers = 1;
  // Transformer layers per resnet/attention pair (size num_layers).
  std::vector<int64_t> transformer_layers;
  double resnet_eps = 1e-5;
  Activation act = Activation::kSilu;
  int64_t resnet_groups = 32;
  TimeEmbeddingNorm time_embedding_norm = TimeEmbeddingNorm::kDefault;
  double output_scale_factor = 1.0;
  int64_t num_attention_heads = 1;  // head_dim = out_channels / num_attention_heads
  int64_t cross_attention_dim = 0;
  bool use_linear_projection = false;
  bool only_cross_attention = false;
  bool upcast_attention = false;
  bool add_downsample = false;
  int64_t downsample_padding = 1;
  bool add_upsample = false;
};

// Skip connections handed from the down path to the up path, in order of creation.
using ResidualStack = std::vector<torch::Tensor>;

// Resnets (each followed by a Transformer2DModel when the block has attention), then an
// optional stride-2 downsampler. Pushes every intermediate onto `residuals`.
struct DownBlock2DImpl : torch::nn::Module {
  DownBlock2DImpl(const UNetBlockOptions& options, bool with_attention);
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& temb, const torch::Tensor& context,
                        ResidualStack& residuals);
  // Only the first `outputs` skip connections: resnet(/attention) pairs, then the downsampler
  // (DeepCache's shallow branch stops inside a block).
  torch::Tensor forward_prefix(torch::Tensor x, const torch::Tensor& temb,
                               const torch::Tensor& context, ResidualStack& residuals,
                               size_t outputs);
  size_t num_outputs() const { return resnet_list.size() + (downsampler ? 1 : 0); }

  bool has_cross_attention;
  torch::nn::ModuleList resnets{nullptr}, attentions{nullptr}, downsamplers{nullptr};
  std::vector<ResnetBlock2D> resnet_list;
  std::vector<Transformer2DModel> attention_list;
  Downsample2D downsampler{nullptr};
};
TORCH_MODULE(DownBlock2D);

// resnets.0, then (attentions.i, resnets.i+1) pairs.
struct UNetMidBlock2DCrossAttnImpl : torch::nn::Module {
  explicit UNetMidBlock2DCrossAttnImpl(const UNetBlockOptions& options);
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& temb, const torch::Tensor& context);

  torch::nn::ModuleList resnets{nullptr}, attentions{nullptr};
  std::vector<ResnetBlock2D> resnet_list;
  std::vector<Transformer2DModel> attention_list;
};
TORCH_MODULE(UNetMidBlock2DCrossAttn);

// Each resnet takes cat(x, skip) where skip is popped from `residuals`; optional attention
// after each resnet; then an optional 2x upsampler (to `upsample_size` when given).
struct UpBlock2DImpl : torch::nn::Module {
  UpBlock2DImpl(const UNetBlockOptions& options, bool with_attention);
  torch::Tensor forward(torch::Tensor x, ResidualStack& residuals, const torch::Tensor& temb,
                        const torch::Tensor& context,
                        std::optional<std::vector<int64_t>> upsample_size = std::nullopt);
  // Resnets [begin, end) only, the upsampler when end is the last (DeepCache enters and
  // leaves a block between resnets).
  torch::Tensor forward_range(torch::Tensor x, ResidualStack& residuals, const torch::Tensor& temb,
                              const torch::Tensor& context, size_t begin, size_t end,
                              std::optional<std::vector<int64_t>> upsample_size = std::nullopt);

  bool has_cross_attention;
  torch::nn::ModuleList resnets{nullptr}, attentions{nullptr}, upsamplers{nullptr};
  std::vector<ResnetBlock2D> resnet_list;
  std::vector<Transformer2DModel> attention_list;
  Upsample2D upsampler{nullptr};
};
TORCH_MODULE(UpBlock2D);

}  // namespace diffuse::nn
