#include "nn/unet_blocks.h"

#include <torch/torch.h>

#include "diffuse/errors.h"
#include "nn/fused_ops.h"

namespace diffuse::nn {
namespace {

ResnetBlock2D make_resnet(const UNetBlockOptions& o, int64_t in, int64_t out) {
  ResnetBlock2DOptions r;
  r.in_channels = in;
  r.out_channels = out;
  r.temb_channels = o.temb_channels;
  r.groups = o.resnet_groups;
  r.eps = o.resnet_eps;
  r.act = o.act;
  r.output_scale_factor = o.output_scale_factor;
  r.time_embedding_norm = o.time_embedding_norm;
  return ResnetBlock2D(r);
}

Transformer2DModel make_transformer(const UNetBlockOptions& o, int64_t channels, int64_t layer,
                                    bool only_cross_attention) {
  Transformer2DOptions t;
  t.heads = o.num_attention_heads;
  t.head_dim = channels / o.num_attention_heads;
  t.in_channels = channels;
  t.num_layers =
      layer < static_cast<int64_t>(o.transformer_layers.size()) ? o.transformer_layers[layer] : 1;
  t.cross_attention_dim = o.cross_attention_dim;
  t.norm_num_groups = o.resnet_groups;
  t.use_linear_projection = o.use_linear_projection;
  t.only_cross_attention = only_cross_attention;
  t.upcast_attention = o.upcast_attention;
  return Transformer2DModel(t);
}

}  // namespace

DownBlock2DImpl::DownBlock2DImpl(const UNetBlockOptions& o, bool with_attention)
    : has_cross_attention(with_attention) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  if (with_attention) attentions = register_module("attentions", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_layers; ++i) {
    resnet_list.push_back(make_resnet(o, i == 0 ? o.in_channels : o.out_channels, o.out_channels));
    resnets->push_back(resnet_list.back());
    if (with_attention) {
      attention_list.push_back(make_transformer(o, o.out_channels, i, o.only_cross_attention));
      attentions->push_back(attention_list.back());
    }
  }
  if (o.add_downsample) {
    downsampler =
        Downsample2D(o.out_channels, /*use_conv=*/true, o.out_channels, o.downsample_padding);
    downsamplers = register_module("downsamplers", torch::nn::ModuleList(downsampler));
  }
}

torch::Tensor DownBlock2DImpl::forward(torch::Tensor x, const torch::Tensor& temb,
                                       const torch::Tensor& context, ResidualStack& residuals) {
  return forward_prefix(std::move(x), temb, context, residuals, num_outputs());
}

torch::Tensor DownBlock2DImpl::forward_prefix(torch::Tensor x, const torch::Tensor& temb,
                                              const torch::Tensor& context,
                                              ResidualStack& residuals, size_t outputs) {
  for (size_t i = 0; i < resnet_list.size() && i < outputs; ++i) {
    x = resnet_list[i](std::move(x), temb);
    if (has_cross_attention) x = attention_list[i](x, context);
    residuals.push_back(x);
  }
  if (downsampler && outputs > resnet_list.size()) {
    x = downsampler(x);
    residuals.push_back(x);
  }
  return x;
}

UNetMidBlock2DCrossAttnImpl::UNetMidBlock2DCrossAttnImpl(const UNetBlockOptions& o) {
  const int64_t c = o.in_channels;
  resnets = register_module("resnets", torch::nn::ModuleList());
  attentions = register_module("attentions", torch::nn::ModuleList());
  resnet_list.push_back(make_resnet(o, c, c));
  resnets->push_back(resnet_list.back());
  for (int64_t i = 0; i < o.num_layers; ++i) {
    // diffusers builds the mid block's transformers without only_cross_attention.
    attention_list.push_back(make_transformer(o, c, i, /*only_cross_attention=*/false));
    attentions->push_back(attention_list.back());
    resnet_list.push_back(make_resnet(o, c, c));
    resnets->push_back(resnet_list.back());
  }
}

torch::Tensor UNetMidBlock2DCrossAttnImpl::forward(torch::Tensor x, const torch::Tensor& temb,
                                                   const torch::Tensor& context) {
  x = resnet_list[0](std::move(x), temb);
  for (size_t i = 0; i < attention_list.size(); ++i) {
    x = attention_list[i](x, context);
    x = resnet_list[i + 1](std::move(x), temb);
  }
  return x;
}

UpBlock2DImpl::UpBlock2DImpl(const UNetBlockOptions& o, bool with_attention)
    : has_cross_attention(with_attention) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  if (with_attention) attentions = register_module("attentions", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_layers; ++i) {
    const int64_t skip = i == o.num_layers - 1 ? o.in_channels : o.out_channels;
    const int64_t in = i == 0 ? o.prev_output_channel : o.out_channels;
    resnet_list.push_back(make_resnet(o, in + skip, o.out_channels));
    resnets->push_back(resnet_list.back());
    if (with_attention) {
      attention_list.push_back(make_transformer(o, o.out_channels, i, o.only_cross_attention));
      attentions->push_back(attention_list.back());
    }
  }
  if (o.add_upsample) {
    upsampler = Upsample2D(o.out_channels, /*use_conv=*/true, o.out_channels);
    upsamplers = register_module("upsamplers", torch::nn::ModuleList(upsampler));
  }
}

torch::Tensor UpBlock2DImpl::forward(torch::Tensor x, ResidualStack& residuals,
                                     const torch::Tensor& temb, const torch::Tensor& context,
                                     std::optional<std::vector<int64_t>> upsample_size) {
  return forward_range(std::move(x), residuals, temb, context, 0, resnet_list.size(),
                       std::move(upsample_size));
}

torch::Tensor UpBlock2DImpl::forward_range(torch::Tensor x, ResidualStack& residuals,
                                           const torch::Tensor& temb, const torch::Tensor& context,
                                           size_t begin, size_t end,
                                           std::optional<std::vector<int64_t>> upsample_size) {
  for (size_t i = begin; i < end && i < resnet_list.size(); ++i) {
    if (residuals.empty())
      throw InvalidArgument("UNet up block: no skip connection left to consume");
    auto skip = std::move(residuals.back());
    residuals.pop_back();
    const auto& w = resnet_list[i]->conv1->weight;
    x = resnet_list[i](torch::cat({to_compute_layout(x, w), to_compute_layout(skip, w)}, 1), temb);
    if (has_cross_attention) x = attention_list[i](x, context);
  }
  if (upsampler && end >= resnet_list.size()) {
    // Upsample to the skip connection the next block consumes first; that is 2x unless the
    // input size was not a multiple of the downsampling factor.
    if (!upsample_size && !residuals.empty())
      upsample_size = std::vector<int64_t>{residuals.back().size(2), residuals.back().size(3)};
    x = upsampler(std::move(x), std::move(upsample_size));
  }
  return x;
}

}  // namespace diffuse::nn
