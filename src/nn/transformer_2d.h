// Spatial transformer of the SD UNet (diffusers transformers/transformer_2d.py, attention.py,
// attention_processor.py): Transformer2DModel = GroupNorm -> proj_in -> BasicTransformerBlocks
// -> proj_out + residual, where proj_in/proj_out are Linear (use_linear_projection, SD2) or
// 1x1 Conv2d (SD1). Registered names equal diffusers' attribute names.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/token_merge_hook.h"

namespace diffuse::nn {

// Multi-head attention with to_q/to_k/to_v (no bias by default) and to_out.0 (with bias).
// Self-attention when `context` is undefined. Runs through nn::attention().
struct AttentionImpl : torch::nn::Module {
  // cross_attention_dim 0 = same as query_dim (self-attention).
  AttentionImpl(int64_t query_dim, int64_t cross_attention_dim, int64_t heads, int64_t dim_head,
                bool bias, bool upcast_attention);
  // hidden_states: [B, N, query_dim]; context: [B, M, cross_attention_dim] or undefined.
  // `residual` (defined: [B, N, query_dim]) is added to the output, in to_out's epilogue.
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& context = {},
                        const torch::Tensor& residual = {});

  int64_t heads, dim_head;
  bool upcast_attention;
  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, out_proj{nullptr};
  torch::nn::ModuleList to_out{nullptr};  // [Linear, Dropout] as in diffusers
};
TORCH_MODULE(Attention);

// proj (Linear dim -> 2*inner), then value * gelu(gate).
struct GEGLUImpl : torch::nn::Module {
  GEGLUImpl(int64_t dim_in, int64_t dim_out);
  torch::Tensor forward(const torch::Tensor& x);
  nn::Linear proj{nullptr};
};
TORCH_MODULE(GEGLU);

// net.0 = GEGLU(dim, 4*dim), net.1 = dropout (identity at inference), net.2 = Linear(4*dim, dim).
struct FeedForwardImpl : torch::nn::Module {
  explicit FeedForwardImpl(int64_t dim, int64_t mult = 4);
  // `residual` (defined: x's shape) is added to the output, in the last linear's epilogue.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& residual = {});
  GEGLU act{nullptr};
  nn::Linear out{nullptr};
  torch::nn::ModuleList net{nullptr};
};
TORCH_MODULE(FeedForward);

struct BasicTransformerBlockOptions {
  int64_t dim = 0;
  int64_t heads = 1;
  int64_t head_dim = 0;
  int64_t cross_attention_dim = 0;
  bool only_cross_attention = false;  // attn1 attends to the context too
  bool upcast_attention = false;
  double norm_eps = 1e-5;
};

// x += attn1(norm1(x)); x += attn2(norm2(x), context); x += ff(norm3(x)).
struct BasicTransformerBlockImpl : torch::nn::Module {
  explicit BasicTransformerBlockImpl(const BasicTransformerBlockOptions& options);
  // With `merge`, attn1 runs on merge(norm1(x)) and its output is unmerged (token merging).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context,
                        const TokenMergePlan* merge = nullptr);

  BasicTransformerBlockOptions options;
  LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  Attention attn1{nullptr}, attn2{nullptr};
  FeedForward ff{nullptr};
};
TORCH_MODULE(BasicTransformerBlock);

struct Transformer2DOptions {
  int64_t heads = 1;
  int64_t head_dim = 0;
  int64_t in_channels = 0;
  int64_t num_layers = 1;
  int64_t cross_attention_dim = 0;
  int64_t norm_num_groups = 32;
  bool use_linear_projection = false;
  bool only_cross_attention = false;
  bool upcast_attention = false;
};

struct Transformer2DModelImpl : torch::nn::Module {
  explicit Transformer2DModelImpl(const Transformer2DOptions& options);
  // x: [B, C, H, W]; context: [B, M, cross_attention_dim]. Returns [B, C, H, W].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context);

  Transformer2DOptions options;
  int64_t inner_dim;
  // Module name in the UNet ("up_blocks.3.attentions.2"), the key a TokenMergeHook selects
  // by; empty = never offered to a hook.
  std::string site;
  GroupNorm norm{nullptr};
  // Exactly one of each pair is set, registered as "proj_in" / "proj_out".
  nn::Linear proj_in_linear{nullptr}, proj_out_linear{nullptr};
  nn::Conv2d proj_in_conv{nullptr}, proj_out_conv{nullptr};
  torch::nn::ModuleList transformer_blocks{nullptr};
  std::vector<BasicTransformerBlock> blocks;
};
TORCH_MODULE(Transformer2DModel);

}  // namespace diffuse::nn
