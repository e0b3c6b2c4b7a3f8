#include "nn/resnet.h"

#include <torch/torch.h>

#include "nn/fused_ops.h"
#include "nn/layers.h"

namespace diffuse::nn {
namespace {

GroupNorm group_norm(int64_t groups, int64_t channels, double eps) {
  return GroupNorm(torch::nn::GroupNormOptions(groups, channels).eps(eps).affine(true));
}

// True when no other tensor or view refers to t's memory, so overwriting it is unobservable
// (the caller moved its last reference in; a UNet skip connection, a traced intermediate or
// a residual taken from it all keep a second reference).
bool sole_owner(const torch::Tensor& t) {
  return t.defined() && t.has_storage() && t.use_count() == 1 && t.storage().use_count() == 1;
}

// act(norm(x)), in one pass for SiLU; written over x's memory when nothing else can see it,
// which saves one activation-sized buffer at the decoder's full-resolution peak.
torch::Tensor norm_act(GroupNorm& norm, torch::Tensor x, Activation act) {
  if (act == Activation::kSilu)
    return sole_owner(x) ? norm->forward_silu_overwriting(x) : norm->forward_silu(x);
  return apply_activation(norm(x), act);
}

nn::Conv2d conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  return nn::make_conv2d(torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding));
}

}  // namespace

ResnetBlock2DImpl::ResnetBlock2DImpl(const ResnetBlock2DOptions& o) : options(o) {
  if (options.out_channels == 0) options.out_channels = options.in_channels;
  if (options.groups_out == 0) options.groups_out = options.groups;
  const int64_t in = options.in_channels, out = options.out_channels;
  norm1 = register_module("norm1", group_norm(options.groups, in, options.eps));
  conv1 = register_module("conv1", conv2d(in, out, 3, 1, 1));
  if (options.temb_channels > 0) {
    int64_t proj = options.time_embedding_norm == TimeEmbeddingNorm::kScaleShift ? 2 * out : out;
    time_emb_proj = register_module("time_emb_proj", nn::make_linear(options.temb_channels, proj));
  }
  norm2 = register_module("norm2", group_norm(options.groups_out, out, options.eps));
  conv2 = register_module("conv2", conv2d(out, out, 3, 1, 1));
  if (in != out) conv_shortcut = register_module("conv_shortcut", conv2d(in, out, 1, 1, 0));
}

torch::Tensor ResnetBlock2DImpl::forward(torch::Tensor input, const torch::Tensor& temb) {
  // The shortcut goes first so that, with a 1x1 conv_shortcut, `input` is needed by nothing
  // else and norm1 can overwrite it (when the caller moved it in). Without one, the residual
  // shares input's memory and norm1 writes a new tensor, as it must.
  input = to_compute_layout(input, conv1->weight);
  auto residual = conv_shortcut ? conv_shortcut(input) : input;
  auto h = conv1(norm_act(norm1, std::move(input), options.act));
  if (time_emb_proj && temb.defined()) {
    auto t = time_emb_proj(apply_activation(temb, options.act)).unsqueeze(-1).unsqueeze(-1);
    if (options.time_embedding_norm == TimeEmbeddingNorm::kScaleShift) {
      auto parts = t.chunk(2, 1);
      h = apply_activation(norm2(h) * (1 + parts[0]) + parts[1], options.act);
    } else {
      h.add_(t);  // in place: h is this block's own tensor
      h = norm_act(norm2, std::move(h), options.act);
    }
  } else {
    h = norm_act(norm2, std::move(h), options.act);
  }
  h = conv2(h);
  // In place (the same sum as shortcut + h): one activation-sized buffer less at the peak.
  auto out = h.add_(residual);
  // diffusers always divides; dividing by exactly 1 changes nothing, so skip the pass.
  if (options.output_scale_factor != 1.0) out = out / options.output_scale_factor;
  return out;
}

Downsample2DImpl::Downsample2DImpl(int64_t channels, bool use_conv, int64_t out_channels,
                                   int64_t padding)
    : channels(channels), use_conv(use_conv), padding(padding) {
  if (out_channels == 0) out_channels = channels;
  if (use_conv) conv = register_module("conv", conv2d(channels, out_channels, 3, 2, padding));
}

torch::Tensor Downsample2DImpl::forward(const torch::Tensor& x) {
  if (!use_conv) return torch::avg_pool2d(x, {2, 2}, {2, 2});
  if (padding == 0) return conv(torch::constant_pad_nd(x, {0, 1, 0, 1}, 0));
  return conv(x);
}

Upsample2DImpl::Upsample2DImpl(int64_t channels, bool use_conv, int64_t out_channels)
    : channels(channels) {
  if (out_channels == 0) out_channels = channels;
  if (use_conv) conv = register_module("conv", conv2d(channels, out_channels, 3, 1, 1));
}

torch::Tensor Upsample2DImpl::forward(torch::Tensor x,
                                      std::optional<std::vector<int64_t>> output_size) {
  std::vector<int64_t> size =
      output_size ? *output_size : std::vector<int64_t>{x.size(2) * 2, x.size(3) * 2};
  torch::Tensor h;
  // Older CUDA builds lack bf16 nearest upsampling; diffusers round-trips through float32
  // there. Nearest copies values exactly, so this is a no-op numerically.
  if (x.scalar_type() == torch::kBFloat16 && !x.device().is_cpu())
    h = torch::upsample_nearest2d(x.to(torch::kFloat32), size).to(x.scalar_type());
  else
    h = torch::upsample_nearest2d(x, size);
  x = torch::Tensor();  // released before the conv when the caller moved it in
  return conv ? conv(h) : h;
}

}  // namespace diffuse::nn
