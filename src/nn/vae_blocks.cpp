#include "nn/vae_blocks.h"

#include <torch/torch.h>

#include <cmath>

#include "nn/attention.h"
#include "nn/layers.h"

namespace diffuse::nn {
namespace {

ResnetBlock2D make_resnet(const VaeBlockOptions& o, int64_t in, int64_t out) {
  ResnetBlock2DOptions r;
  r.in_channels = in;
  r.out_channels = out;
  r.temb_channels = 0;
  r.groups = o.groups;
  r.eps = o.eps;
  r.act = o.act;
  return ResnetBlock2D(r);
}

}  // namespace

SpatialSelfAttentionImpl::SpatialSelfAttentionImpl(int64_t channels, int64_t heads,
                                                   int64_t norm_groups, double eps,
                                                   double rescale_output_factor)
    : channels(channels), heads(heads), rescale_output_factor(rescale_output_factor) {
  group_norm = register_module(
      "group_norm",
      GroupNorm(torch::nn::GroupNormOptions(norm_groups, channels).eps(eps).affine(true)));
  to_q = register_module("to_q", nn::make_linear(channels, channels));
  to_k = register_module("to_k", nn::make_linear(channels, channels));
  to_v = register_module("to_v", nn::make_linear(channels, channels));
  out_proj = nn::make_linear(channels, channels);
  to_out = register_module("to_out", torch::nn::ModuleList(out_proj, torch::nn::Dropout(0.0)));
}

torch::Tensor SpatialSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), N = H * W;
  const int64_t D = C / heads;
  // diffusers normalises the [B, C, H*W] view; GroupNorm on [B, C, H, W] is the same math.
  // [B, C, H, W] -> tokens [B, N, C]: a view for channels-last activations.
  auto tokens = group_norm(x).permute({0, 2, 3, 1}).reshape({B, N, C});
  auto q = to_q(tokens).view({B, N, heads, D}).transpose(1, 2);
  auto k = to_k(tokens).view({B, N, heads, D}).transpose(1, 2);
  auto v = to_v(tokens).view({B, N, heads, D}).transpose(1, 2);
  AttentionOptions opts;
  opts.scale = std::pow(static_cast<double>(D), -0.5);
  // diffusers builds this attention with upcast_softmax=True; upcasting q·k as well only
  // adds precision for half-precision runs and is a no-op in float32.
  opts.upcast = true;
  auto o = attention(q, k, v, opts).transpose(1, 2).reshape({B, N, C});
  auto h = out_proj(o).transpose(1, 2).view({B, C, H, W});
  auto out = x + h;
  if (rescale_output_factor != 1.0) out = out / rescale_output_factor;
  return out;
}

DownEncoderBlock2DImpl::DownEncoderBlock2DImpl(const VaeBlockOptions& o) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_layers; ++i) {
    resnet_list.push_back(make_resnet(o, i == 0 ? o.in_channels : o.out_channels, o.out_channels));
    resnets->push_back(resnet_list.back());
  }
  if (o.add_resample) {
    downsampler =
        Downsample2D(o.out_channels, /*use_conv=*/true, o.out_channels, o.downsample_padding);
    downsamplers = register_module("downsamplers", torch::nn::ModuleList(downsampler));
  }
}

torch::Tensor DownEncoderBlock2DImpl::forward(torch::Tensor x) {
  for (auto& r : resnet_list) x = r(std::move(x));
  return downsampler ? downsampler(x) : x;
}

UpDecoderBlock2DImpl::UpDecoderBlock2DImpl(const VaeBlockOptions& o) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_layers; ++i) {
    resnet_list.push_back(make_resnet(o, i == 0 ? o.in_channels : o.out_channels, o.out_channels));
    resnets->push_back(resnet_list.back());
  }
  if (o.add_resample) {
    upsampler = Upsample2D(o.out_channels, /*use_conv=*/true, o.out_channels);
    upsamplers = register_module("upsamplers", torch::nn::ModuleList(upsampler));
  }
}

torch::Tensor UpDecoderBlock2DImpl::forward(torch::Tensor x) {
  for (auto& r : resnet_list) x = r(std::move(x));
  return upsampler ? upsampler(std::move(x)) : x;
}

UNetMidBlock2DImpl::UNetMidBlock2DImpl(const VaeBlockOptions& o) {
  const int64_t c = o.in_channels;
  resnets = register_module("resnets", torch::nn::ModuleList());
  if (o.add_attention) attentions = register_module("attentions", torch::nn::ModuleList());
  resnet_list.push_back(make_resnet(o, c, c));
  resnets->push_back(resnet_list.back());
  const int64_t head_dim = o.attention_head_dim > 0 ? o.attention_head_dim : c;
  for (int64_t i = 0; i < o.num_layers; ++i) {
    if (o.add_attention) {
      attention_list.push_back(SpatialSelfAttention(c, c / head_dim, o.groups, o.eps));
      attentions->push_back(attention_list.back());
    }
    resnet_list.push_back(make_resnet(o, c, c));
    resnets->push_back(resnet_list.back());
  }
}

torch::Tensor UNetMidBlock2DImpl::forward(torch::Tensor x) {
  x = resnet_list[0](std::move(x));
  for (size_t i = 1; i < resnet_list.size(); ++i) {
    if (!attention_list.empty()) x = attention_list[i - 1](x);
    x = resnet_list[i](std::move(x));
  }
  return x;
}

}  // namespace diffuse::nn
