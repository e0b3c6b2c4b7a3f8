// The VAE's Encoder and Decoder (diffusers autoencoders/vae.py).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <vector>

#include "models/intermediates.h"
#include "nn/layers.h"
#include "nn/vae_blocks.h"

namespace diffuse::models {

struct VaeCoderOptions {
  int64_t in_channels = 3;
  int64_t out_channels = 3;  // the encoder emits 2 * out_channels (mean and logvar)
  std::vector<int64_t> block_out_channels;
  int64_t layers_per_block = 2;
  int64_t norm_num_groups = 32;
  nn::Activation act = nn::Activation::kSilu;
  bool mid_block_add_attention = true;
};

// conv_in -> down_blocks (DownEncoderBlock2D) -> mid_block -> conv_norm_out -> SiLU -> conv_out.
struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(const VaeCoderOptions& options);
  // Records "<prefix>conv_in", "<prefix>down_blocks.i", "<prefix>mid_block",
  // "<prefix>conv_norm_out", "<prefix>conv_out" when `inter` is set.
  torch::Tensor forward(const torch::Tensor& x, Intermediates* inter = nullptr,
                        const std::string& prefix = "");

  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  std::vector<nn::DownEncoderBlock2D> down_list;
  nn::UNetMidBlock2D mid_block{nullptr};
  nn::GroupNorm conv_norm_out{nullptr};
};
TORCH_MODULE(Encoder);

// conv_in -> mid_block -> up_blocks (UpDecoderBlock2D) -> conv_norm_out -> SiLU -> conv_out.
struct DecoderImpl : torch::nn::Module {
  explicit DecoderImpl(const VaeCoderOptions& options);
  torch::Tensor forward(const torch::Tensor& z, Intermediates* inter = nullptr,
                        const std::string& prefix = "");

  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  nn::UNetMidBlock2D mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  std::vector<nn::UpDecoderBlock2D> up_list;
  nn::GroupNorm conv_norm_out{nullptr};
};
TORCH_MODULE(Decoder);

}  // namespace diffuse::models
