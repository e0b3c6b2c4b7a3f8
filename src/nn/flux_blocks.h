// The blocks of FLUX.1's MM-DiT (diffusers transformer_flux.py), with diffusers' module names:
// FluxAttention (per-head q/k RMSNorm, joint attention over [text | image] with separate
// projections for the text stream in the double-stream blocks), the double-stream
// FluxTransformerBlock (AdaLayerNormZero per stream, GELU-tanh feed-forwards) and the
// single-stream FluxSingleTransformerBlock (attention and MLP side by side, one output
// projection).
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <utility>

#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/rope.h"

namespace diffuse::parallel {
class UlyssesShard;
}

namespace diffuse::nn {

// The epsilon of FLUX's q/k RMSNorms and of its affine-free LayerNorms (blocks and norm_out).
constexpr double kFluxNormEps = 1e-6;

// The module names of a double-stream block. Qwen-Image's QwenImageTransformerBlock computes
// exactly what FLUX's does (adaLN-Zero per stream, joint attention, GELU-tanh MLPs) under other
// names, so one implementation serves both with diffusers' names for each.
struct DualBlockNames {
  const char* image_mod = "norm1";
  const char* text_mod = "norm1_context";
  const char* mod_linear = "linear";  // Qwen: nn.Sequential(SiLU, Linear) -> "1"
  const char* image_ff = "ff";
  const char* text_ff = "ff_context";
};
inline DualBlockNames qwen_image_block_names() {
  return {"img_mod", "txt_mod", "1", "img_mlp", "txt_mlp"};
}

struct FluxBlockOptions {
  int64_t dim = 0;  // heads * head_dim
  int64_t heads = 0;
  int64_t head_dim = 0;
  double mlp_ratio = 4.0;
  DualBlockNames names;
  bool clip_image_fp16 = false;  // Qwen-Image clips the image stream to float16's range too
};

// What every block of one forward pass shares.
struct FluxBlockInputs {
  torch::Tensor temb;               // [B, dim]: timestep + guidance + pooled-text embedding
  const RopeTable* rope = nullptr;  // one row per token of the joint [text | image] sequence
  // Ulysses sequence parallelism (parallel/ulysses.h): the image tokens a block sees are this
  // rank's share; the attention trades them for a share of the heads and back. The RoPE table
  // still describes the whole sequence. Null: one device.
  parallel::UlyssesShard* ulysses = nullptr;
};

// AdaLayerNormZero's and AdaLayerNormZeroSingle's modulation: a Linear(dim, chunks * dim) on
// silu(temb), registered as "<name>.<linear_name>".
struct FluxModulationImpl : torch::nn::Module {
  FluxModulationImpl(int64_t dim, int64_t chunks, const char* linear_name = "linear");
  // temb [B, dim] -> `chunks` tensors [B, 1, dim].
  std::vector<torch::Tensor> forward(const torch::Tensor& temb);

  int64_t chunks;
  nn::Linear linear{nullptr};
};
TORCH_MODULE(FluxModulation);

struct FluxAttentionImpl : torch::nn::Module {
  // `context`: the double-stream attention, with the text stream's projections (add_*_proj,
  // norm_added_*, to_add_out) and an output projection; otherwise the single-stream one,
  // which has neither.
  FluxAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, bool context);
  // Single stream: attention over the joint tokens [B, N, dim] -> [B, N, heads*head_dim],
  // without an output projection.
  torch::Tensor forward_single(const torch::Tensor& tokens, const FluxBlockInputs& in);
  // Double stream: joint attention over [text | image] -> (image out, text out), projected.
  std::pair<torch::Tensor, torch::Tensor> forward_joint(const torch::Tensor& image,
                                                        const torch::Tensor& text,
                                                        const FluxBlockInputs& in);

  int64_t heads, head_dim;
  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr};
  RMSNorm norm_q{nullptr}, norm_k{nullptr};
  nn::Linear add_q_proj{nullptr}, add_k_proj{nullptr}, add_v_proj{nullptr}, to_add_out{nullptr};
  RMSNorm norm_added_q{nullptr}, norm_added_k{nullptr};
};
TORCH_MODULE(FluxAttention);

// diffusers FeedForward(dim, activation_fn="gelu-approximate"): net.0.proj, GELU (tanh), net.2.
struct FluxFeedForwardImpl : torch::nn::Module {
  FluxFeedForwardImpl(int64_t dim, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x);

  nn::Linear proj{nullptr}, out{nullptr};
};
TORCH_MODULE(FluxFeedForward);

struct FluxTransformerBlockImpl : torch::nn::Module {
  explicit FluxTransformerBlockImpl(const FluxBlockOptions& o);
  // image [B, Ni, dim], text [B, Nt, dim] -> updated (image, text).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& image,
                                                  const torch::Tensor& text,
                                                  const FluxBlockInputs& in);

  FluxModulation norm1{nullptr}, norm1_context{nullptr};
  FluxAttention attn{nullptr};
  FluxFeedForward ff{nullptr}, ff_context{nullptr};
  bool clip_image_fp16 = false;
};
TORCH_MODULE(FluxTransformerBlock);

struct FluxSingleTransformerBlockImpl : torch::nn::Module {
  explicit FluxSingleTransformerBlockImpl(const FluxBlockOptions& o);
  // tokens [B, N, dim] (text first, then image) -> updated tokens.
  torch::Tensor forward(const torch::Tensor& tokens, const FluxBlockInputs& in);

  FluxModulation norm{nullptr};
  FluxAttention attn{nullptr};
  nn::Linear proj_mlp{nullptr}, proj_out{nullptr};
};
TORCH_MODULE(FluxSingleTransformerBlock);

// LayerNorm without affine parameters (eps 1e-6), then x * (1 + scale) + shift with
// scale/shift [B, 1, dim]: the adaLN modulation of every FLUX block and of norm_out.
torch::Tensor flux_modulate(const torch::Tensor& x, const torch::Tensor& shift,
                            const torch::Tensor& scale);

}  // namespace diffuse::nn
