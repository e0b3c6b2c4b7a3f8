// The blocks of HiDream's sparse DiT (diffusers transformer_hidream_image.py), with diffusers'
// module names: HiDreamAttention (separate image/text projections in the dual-stream blocks,
// q/k RMSNorm over the whole inner dimension, joint attention), the dual-stream
// HiDreamImageTransformerBlock and the single-stream HiDreamImageSingleTransformerBlock, each
// wrapped in a HiDreamImageBlock (hence the ".block." in parameter names).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <utility>

#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/moe_feed_forward.h"
#include "nn/rope.h"

namespace diffuse::parallel {
class UlyssesShard;
}

namespace diffuse::nn {

// The epsilon of the blocks' affine-free LayerNorms (hidream_modulate).
constexpr double kHiDreamBlockNormEps = 1e-6;

struct HiDreamBlockOptions {
  int64_t dim = 0;  // heads * head_dim
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t num_routed_experts = 4;  // 0: a plain SwiGLU instead of the mixture
  int64_t num_activated_experts = 2;
};

// What every block of one forward pass shares.
struct HiDreamBlockInputs {
  torch::Tensor adaln_input;        // [B, dim]: timestep + pooled-text embedding
  const RopeTable* rope = nullptr;  // rotates the image tokens (the first rope->tokens())
  // [B, image tokens], 1 = real, 0 = padding, or undefined (no padding). Multiplies the image
  // tokens' KEYS only, as diffusers does: padded keys keep logit 0 and a share of the softmax.
  torch::Tensor image_token_mask;
  // Ulysses sequence parallelism (parallel/ulysses.h): the image tokens a block sees are this
  // rank's share; the attention trades them for a share of the heads and back. The mask and
  // the RoPE table still describe the whole image sequence. Null: one device.
  parallel::UlyssesShard* ulysses = nullptr;
};

struct HiDreamAttentionImpl : torch::nn::Module {
  HiDreamAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, bool single);
  // Single stream: attention over `image` (image tokens first, then any text) -> [B, N, dim].
  torch::Tensor forward_single(const torch::Tensor& image, const HiDreamBlockInputs& in);
  // Dual stream: joint attention over [image | text] -> (image out, text out).
  std::pair<torch::Tensor, torch::Tensor> forward_dual(const torch::Tensor& image,
                                                       const torch::Tensor& text,
                                                       const HiDreamBlockInputs& in);

  int64_t heads, head_dim;
  bool single;
  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr};
  RMSNorm q_rms_norm{nullptr}, k_rms_norm{nullptr};
  nn::Linear to_q_t{nullptr}, to_k_t{nullptr}, to_v_t{nullptr}, to_out_t{nullptr};
  RMSNorm q_rms_norm_t{nullptr}, k_rms_norm_t{nullptr};
};
TORCH_MODULE(HiDreamAttention);

// The image feed-forward of both block kinds: a mixture of experts, or a plain SwiGLU.
class HiDreamImageFeedForward {
 public:
  HiDreamImageFeedForward() = default;
  HiDreamImageFeedForward(torch::nn::Module& owner, const HiDreamBlockOptions& o);
  torch::Tensor operator()(const torch::Tensor& x) const;
  MOEFeedForwardSwiGLU moe() const { return moe_; }   // null without experts
  FeedForwardSwiGLU plain() const { return plain_; }  // null with experts

 private:
  MOEFeedForwardSwiGLU moe_{nullptr};
  FeedForwardSwiGLU plain_{nullptr};
};

struct HiDreamImageTransformerBlockImpl : torch::nn::Module {
  explicit HiDreamImageTransformerBlockImpl(const HiDreamBlockOptions& o);
  // image [B, Ni, dim], text [B, Nt, dim] -> updated (image, text).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& image,
                                                  const torch::Tensor& text,
                                                  const HiDreamBlockInputs& in);

  torch::nn::Sequential adaLN_modulation{nullptr};  // SiLU, Linear(dim, 12 * dim)
  nn::Linear modulation{nullptr};
  HiDreamAttention attn1{nullptr};
  HiDreamImageFeedForward ff_i;
  FeedForwardSwiGLU ff_t{nullptr};
};
TORCH_MODULE(HiDreamImageTransformerBlock);

struct HiDreamImageSingleTransformerBlockImpl : torch::nn::Module {
  explicit HiDreamImageSingleTransformerBlockImpl(const HiDreamBlockOptions& o);
  // tokens [B, N, dim] (image first, then text) -> updated tokens.
  torch::Tensor forward(const torch::Tensor& tokens, const HiDreamBlockInputs& in);

  torch::nn::Sequential adaLN_modulation{nullptr};  // SiLU, Linear(dim, 6 * dim)
  nn::Linear modulation{nullptr};
  HiDreamAttention attn1{nullptr};
  HiDreamImageFeedForward ff_i;
};
TORCH_MODULE(HiDreamImageSingleTransformerBlock);

// LayerNorm without affine parameters (eps 1e-6), then x * (1 + scale) + shift with
// scale/shift [B, 1, dim]: the adaLN modulation of every HiDream block.
torch::Tensor hidream_modulate(const torch::Tensor& x, const torch::Tensor& shift,
                               const torch::Tensor& scale);

}  // namespace diffuse::nn
