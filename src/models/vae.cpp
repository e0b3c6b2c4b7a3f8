#include "models/vae.h"

#include <torch/torch.h>

#include "nn/layers.h"

namespace diffuse::models {
namespace {

// diffusers hard-codes these for the VAE regardless of the config's norm_eps.
constexpr double kVaeEps = 1e-6;

nn::Conv2d conv3x3(int64_t in, int64_t out) {
  return nn::make_conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1));
}

nn::GroupNorm group_norm(int64_t groups, int64_t channels) {
  return nn::GroupNorm(torch::nn::GroupNormOptions(groups, channels).eps(kVaeEps));
}

nn::UNetMidBlock2D make_mid_block(const VaeCoderOptions& o) {
  nn::VaeBlockOptions m;
  m.in_channels = m.out_channels = o.block_out_channels.back();
  m.eps = kVaeEps;
  m.act = o.act;
  m.groups = o.norm_num_groups;
  m.add_attention = o.mid_block_add_attention;
  m.attention_head_dim = o.block_out_channels.back();  // one head over all channels
  return nn::UNetMidBlock2D(m);
}

}  // namespace

EncoderImpl::EncoderImpl(const VaeCoderOptions& o) {
  const auto& boc = o.block_out_channels;
  const int64_t n = static_cast<int64_t>(boc.size());
  conv_in = register_module("conv_in", conv3x3(o.in_channels, boc[0]));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  int64_t output_channel = boc[0];
  for (int64_t i = 0; i < n; ++i) {
    nn::VaeBlockOptions b;
    b.in_channels = output_channel;
    b.out_channels = output_channel = boc[i];
    b.num_layers = o.layers_per_block;
    b.eps = kVaeEps;
    b.act = o.act;
    b.groups = o.norm_num_groups;
    b.add_resample = i < n - 1;
    b.downsample_padding = 0;
    down_list.emplace_back(b);
    down_blocks->push_back(down_list.back());
  }
  mid_block = register_module("mid_block", make_mid_block(o));
  conv_norm_out = register_module("conv_norm_out", group_norm(o.norm_num_groups, boc.back()));
  conv_out = register_module("conv_out", conv3x3(boc.back(), 2 * o.out_channels));
}

torch::Tensor EncoderImpl::forward(const torch::Tensor& x, Intermediates* inter,
                                   const std::string& prefix) {
  auto h = conv_in(nn::to_compute_layout(x, conv_in->weight));
  capture(inter, prefix + "conv_in", h);
  for (size_t i = 0; i < down_list.size(); ++i) {
    h = down_list[i](std::move(h));
    capture(inter, prefix + "down_blocks." + std::to_string(i), h);
  }
  h = mid_block(std::move(h));
  capture(inter, prefix + "mid_block", h);
  h = conv_norm_out(h);
  capture(inter, prefix + "conv_norm_out", h);
  h = conv_out(torch::silu(h));  // diffusers uses nn.SiLU here whatever act_fn says
  capture(inter, prefix + "conv_out", h);
  return h;
}

DecoderImpl::DecoderImpl(const VaeCoderOptions& o) {
  const auto& boc = o.block_out_channels;
  const int64_t n = static_cast<int64_t>(boc.size());
  conv_in = register_module("conv_in", conv3x3(o.in_channels, boc.back()));
  mid_block = register_module("mid_block", make_mid_block(o));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  int64_t output_channel = boc.back();
  for (int64_t i = 0; i < n; ++i) {
    nn::VaeBlockOptions b;
    b.in_channels = output_channel;
    b.out_channels = output_channel = boc[n - 1 - i];
    b.num_layers = o.layers_per_block + 1;
    b.eps = kVaeEps;
    b.act = o.act;
    b.groups = o.norm_num_groups;
    b.add_resample = i < n - 1;
    up_list.emplace_back(b);
    up_blocks->push_back(up_list.back());
  }
  conv_norm_out = register_module("conv_norm_out", group_norm(o.norm_num_groups, boc[0]));
  conv_out = register_module("conv_out", conv3x3(boc[0], o.out_channels));
}

torch::Tensor DecoderImpl::forward(const torch::Tensor& z, Intermediates* inter,
                                   const std::string& prefix) {
  auto h = conv_in(nn::to_compute_layout(z, conv_in->weight));
  capture(inter, prefix + "conv_in", h);
  h = mid_block(std::move(h));
  capture(inter, prefix + "mid_block", h);
  for (size_t i = 0; i < up_list.size(); ++i) {
    h = up_list[i](std::move(h));
    capture(inter, prefix + "up_blocks." + std::to_string(i), h);
  }
  h = conv_norm_out(h);
  capture(inter, prefix + "conv_norm_out", h);
  h = conv_out(torch::silu(h));
  capture(inter, prefix + "conv_out", h);
  return h;
}

}  // namespace diffuse::models
