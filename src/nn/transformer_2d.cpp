#include "nn/transformer_2d.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "nn/attention.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"

namespace diffuse::nn {

AttentionImpl::AttentionImpl(int64_t query_dim, int64_t cross_attention_dim, int64_t heads,
                             int64_t dim_head, bool bias, bool upcast_attention)
    : heads(heads), dim_head(dim_head), upcast_attention(upcast_attention) {
  const int64_t inner = heads * dim_head;
  const int64_t kv_dim = cross_attention_dim > 0 ? cross_attention_dim : query_dim;
  to_q = register_module("to_q",
                         nn::make_linear(torch::nn::LinearOptions(query_dim, inner).bias(bias)));
  to_k =
      register_module("to_k", nn::make_linear(torch::nn::LinearOptions(kv_dim, inner).bias(bias)));
  to_v =
      register_module("to_v", nn::make_linear(torch::nn::LinearOptions(kv_dim, inner).bias(bias)));
  out_proj = nn::make_linear(inner, query_dim);
  to_out = register_module("to_out", torch::nn::ModuleList(out_proj, torch::nn::Dropout(0.0)));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& hidden_states,
                                     const torch::Tensor& context, const torch::Tensor& residual) {
  const auto& ctx = context.defined() ? context : hidden_states;
  const int64_t B = hidden_states.size(0), N = hidden_states.size(1), M = ctx.size(1);
  // [B, N, H*D] -> [B, H, N, D] as views; nn::attention copies only if its backend needs to.
  auto q = to_q(hidden_states).view({B, N, heads, dim_head}).transpose(1, 2);
  auto k = to_k(ctx).view({B, M, heads, dim_head}).transpose(1, 2);
  auto v = to_v(ctx).view({B, M, heads, dim_head}).transpose(1, 2);
  AttentionOptions opts;
  opts.scale = std::pow(static_cast<double>(dim_head), -0.5);  // diffusers: dim_head**-0.5
  opts.upcast = upcast_attention;
  auto o = attention(q, k, v, opts).transpose(1, 2).reshape({B, N, heads * dim_head});
  // to_out.1 is dropout: identity at inference.
  return residual.defined() ? out_proj->forward_add(o, residual) : out_proj(o);
}

GEGLUImpl::GEGLUImpl(int64_t dim_in, int64_t dim_out) {
  proj = register_module("proj", nn::make_linear(dim_in, dim_out * 2));
}

torch::Tensor GEGLUImpl::forward(const torch::Tensor& x) {
  // For bf16 on the CPU the bias joins the GEGLU pass rather than a pass of its own over the
  // 2x-wide product.
  if (fused_bf16_epilogue({x}, {proj->weight, proj->bias}))
    return geglu(proj->product(x), proj->bias);
  return geglu(proj(x));
}

FeedForwardImpl::FeedForwardImpl(int64_t dim, int64_t mult) {
  act = GEGLU(dim, dim * mult);
  out = nn::make_linear(dim * mult, dim);
  net = register_module("net", torch::nn::ModuleList(act, torch::nn::Dropout(0.0), out));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x, const torch::Tensor& residual) {
  return residual.defined() ? out->forward_add(act(x), residual) : out(act(x));
}

BasicTransformerBlockImpl::BasicTransformerBlockImpl(const BasicTransformerBlockOptions& o)
    : options(o) {
  auto ln = [&](int64_t d) {
    return LayerNorm(torch::nn::LayerNormOptions({d}).eps(o.norm_eps).elementwise_affine(true));
  };
  norm1 = register_module("norm1", ln(o.dim));
  attn1 =
      register_module("attn1", Attention(o.dim, o.only_cross_attention ? o.cross_attention_dim : 0,
                                         o.heads, o.head_dim, /*bias=*/false, o.upcast_attention));
  norm2 = register_module("norm2", ln(o.dim));
  attn2 = register_module("attn2", Attention(o.dim, o.cross_attention_dim, o.heads, o.head_dim,
                                             /*bias=*/false, o.upcast_attention));
  norm3 = register_module("norm3", ln(o.dim));
  ff = register_module("ff", FeedForward(o.dim));
}

torch::Tensor BasicTransformerBlockImpl::forward(const torch::Tensor& x,
                                                 const torch::Tensor& context,
                                                 const TokenMergePlan* merge) {
  const auto attn1_context = options.only_cross_attention ? context : torch::Tensor();
  // The residual adds happen in the output projections' epilogues (except around a token
  // merge, whose unmerge comes between).
  auto h = merge ? merge->unmerge(attn1(merge->merge(norm1(x)), attn1_context)) + x
                 : attn1(norm1(x), attn1_context, x);
  h = attn2(norm2(h), context, h);
  return ff(norm3(h), h);
}

Transformer2DModelImpl::Transformer2DModelImpl(const Transformer2DOptions& o)
    : options(o), inner_dim(o.heads * o.head_dim) {
  norm = register_module(
      "norm", GroupNorm(torch::nn::GroupNormOptions(o.norm_num_groups, o.in_channels).eps(1e-6)));
  if (o.use_linear_projection) {
    proj_in_linear = register_module("proj_in", nn::make_linear(o.in_channels, inner_dim));
  } else {
    proj_in_conv = register_module(
        "proj_in", nn::make_conv2d(torch::nn::Conv2dOptions(o.in_channels, inner_dim, 1)));
  }
  transformer_blocks = register_module("transformer_blocks", torch::nn::ModuleList());
  BasicTransformerBlockOptions bo;
  bo.dim = inner_dim;
  bo.heads = o.heads;
  bo.head_dim = o.head_dim;
  bo.cross_attention_dim = o.cross_attention_dim;
  bo.only_cross_attention = o.only_cross_attention;
  bo.upcast_attention = o.upcast_attention;
  for (int64_t i = 0; i < o.num_layers; ++i) {
    blocks.emplace_back(bo);
    transformer_blocks->push_back(blocks.back());
  }
  if (o.use_linear_projection) {
    proj_out_linear = register_module("proj_out", nn::make_linear(inner_dim, o.in_channels));
  } else {
    proj_out_conv = register_module(
        "proj_out", nn::make_conv2d(torch::nn::Conv2dOptions(inner_dim, o.in_channels, 1)));
  }
}

torch::Tensor Transformer2DModelImpl::forward(const torch::Tensor& x,
                                              const torch::Tensor& context) {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  auto h = norm(x);
  if (proj_in_linear) {
    // [B, C, H, W] -> tokens [B, H*W, C]; a view when x is channels-last.
    h = proj_in_linear(h.permute({0, 2, 3, 1}).reshape({B, H * W, C}));
  } else {
    h = proj_in_conv(h);
    h = h.permute({0, 2, 3, 1}).reshape({B, H * W, inner_dim});
  }
  auto* hook = site.empty() ? nullptr : active_token_merge_hook();
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::optional<TokenMergePlan> plan;
    if (hook) plan = hook->plan(site, static_cast<int64_t>(i), h, H, W);
    h = blocks[i](h, context, plan ? &*plan : nullptr);
  }
  if (proj_out_linear) {
    // Channels-last x is already [B, H*W, C] in memory: the residual joins proj_out's
    // epilogue, and the sum comes out channels-last like x.
    if (x.is_contiguous(torch::MemoryFormat::ChannelsLast) && !x.is_contiguous())
      return proj_out_linear->forward_add(h, x.permute({0, 2, 3, 1}).reshape({B, H * W, C}))
          .view({B, H, W, C})
          .permute({0, 3, 1, 2});
    h = proj_out_linear(h).view({B, H, W, C}).permute({0, 3, 1, 2});
  } else {
    // Like diffusers' .contiguous() before the 1x1 conv, but in the layout x already has, so
    // a channels-last run copies nothing.
    h = proj_out_conv(
        h.view({B, H, W, inner_dim}).permute({0, 3, 1, 2}).contiguous(x.suggest_memory_format()));
  }
  // x first: the sum takes x's memory layout (the same value as diffusers' h + x).
  return x + h;
}

}  // namespace diffuse::nn
