#include "nn/hidream_blocks.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "parallel/ulysses.h"

namespace diffuse::nn {
namespace {

constexpr double kQkNormEps = 1e-5;  // HiDreamAttention's RMSNorm eps

torch::nn::Sequential make_modulation(torch::nn::Module& owner, int64_t dim, int64_t chunks,
                                      nn::Linear* linear) {
  *linear = make_linear(dim, chunks * dim);
  // diffusers: nn.Sequential(nn.SiLU(), nn.Linear(...)), so the weights are "adaLN_modulation.1.*".
  return owner.register_module("adaLN_modulation",
                               torch::nn::Sequential(torch::nn::SiLU(), *linear));
}

// [B, dim] conditioning -> `chunks` tensors [B, 1, dim].
std::vector<torch::Tensor> modulation_chunks(nn::Linear linear, const torch::Tensor& adaln_input,
                                             int64_t chunks) {
  return linear(torch::silu(adaln_input)).unsqueeze(1).chunk(chunks, -1);
}

}  // namespace

torch::Tensor hidream_modulate(const torch::Tensor& x, const torch::Tensor& shift,
                               const torch::Tensor& scale) {
  return layer_norm(x, {}, {}, kHiDreamBlockNormEps) * (1 + scale) + shift;
}

HiDreamAttentionImpl::HiDreamAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim,
                                           bool single)
    : heads(heads), head_dim(head_dim), single(single) {
  const int64_t inner = heads * head_dim;
  to_q = register_module("to_q", make_linear(dim, inner));
  to_k = register_module("to_k", make_linear(inner, inner));
  to_v = register_module("to_v", make_linear(inner, inner));
  to_out = register_module("to_out", make_linear(inner, dim));
  q_rms_norm = register_module("q_rms_norm", RMSNorm(inner, kQkNormEps));
  k_rms_norm = register_module("k_rms_norm", RMSNorm(inner, kQkNormEps));
  if (!single) {
    to_q_t = register_module("to_q_t", make_linear(dim, inner));
    to_k_t = register_module("to_k_t", make_linear(inner, inner));
    to_v_t = register_module("to_v_t", make_linear(inner, inner));
    to_out_t = register_module("to_out_t", make_linear(inner, dim));
    q_rms_norm_t = register_module("q_rms_norm_t", RMSNorm(inner, kQkNormEps));
    k_rms_norm_t = register_module("k_rms_norm_t", RMSNorm(inner, kQkNormEps));
  }
}

namespace {

struct Qkv {
  torch::Tensor q, k, v;  // [B, N, H, D]
};

Qkv project(const torch::Tensor& x, nn::Linear to_q, nn::Linear to_k, nn::Linear to_v,
            RMSNorm q_norm, RMSNorm k_norm, int64_t heads, int64_t head_dim) {
  const int64_t B = x.size(0), N = x.size(1);
  return {q_norm(to_q(x)).view({B, N, heads, head_dim}),
          k_norm(to_k(x)).view({B, N, heads, head_dim}), to_v(x).view({B, N, heads, head_dim})};
}

// Masks the image keys, rotates q and k, attends; q, k, v [B, N, H, D] -> [B, N, H*D].
torch::Tensor joint_attention(torch::Tensor q, torch::Tensor k, const torch::Tensor& v,
                              const HiDreamBlockInputs& in, int64_t head_dim) {
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2);
  if (in.image_token_mask.defined()) {
    const int64_t M = in.image_token_mask.size(1);
    k = k.clone();
    k.narrow(1, 0, M).mul_(in.image_token_mask.to(k.scalar_type()).view({B, M, 1, 1}));
  }
  if (in.rope) {
    q = apply_rope(q, *in.rope);
    k = apply_rope(k, *in.rope);
  }
  AttentionOptions opts;
  opts.scale = std::pow(static_cast<double>(head_dim), -0.5);
  auto o = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), opts);
  return o.transpose(1, 2).reshape({B, N, H * head_dim});
}

// Joint attention of image and text tokens -> (image out, text out), each [B, N, H*D]. With
// Ulysses, `image` holds this rank's tokens: they are traded for all tokens of this rank's
// heads (the text, held whole by every rank, keeps those heads), and the outputs traded back.
std::pair<torch::Tensor, torch::Tensor> attend(const Qkv& image, const Qkv& text,
                                               const HiDreamBlockInputs& in, int64_t head_dim) {
  if (!in.ulysses) {
    const int64_t Ni = image.q.size(1), Nt = text.q.size(1);
    auto o = joint_attention(torch::cat({image.q, text.q}, 1), torch::cat({image.k, text.k}, 1),
                             torch::cat({image.v, text.v}, 1), in, head_dim);
    return {o.narrow(1, 0, Ni), o.narrow(1, Ni, Nt)};
  }
  return in.ulysses->attend_joint(
      {image.q, image.k, image.v}, {text.q, text.k, text.v}, /*text_first=*/false,
      [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
        return joint_attention(q, k, v, in, head_dim);
      });
}

Qkv tokens_of(const Qkv& p, int64_t first, int64_t count) {
  return {p.q.narrow(1, first, count), p.k.narrow(1, first, count), p.v.narrow(1, first, count)};
}

}  // namespace

torch::Tensor HiDreamAttentionImpl::forward_single(const torch::Tensor& x,
                                                   const HiDreamBlockInputs& in) {
  auto p = project(x, to_q, to_k, to_v, q_rms_norm, k_rms_norm, heads, head_dim);
  if (!in.ulysses) return to_out(joint_attention(p.q, p.k, p.v, in, head_dim));
  // This rank's image tokens come first, then the text.
  const int64_t N = x.size(1), Ni = in.ulysses->rows().count;
  auto [oi, ot] = attend(tokens_of(p, 0, Ni), tokens_of(p, Ni, N - Ni), in, head_dim);
  return to_out(torch::cat({oi, ot}, 1));
}

std::pair<torch::Tensor, torch::Tensor> HiDreamAttentionImpl::forward_dual(
    const torch::Tensor& image, const torch::Tensor& text, const HiDreamBlockInputs& in) {
  if (single) throw InvalidArgument("HiDreamAttention: a single-stream attention has no text path");
  auto pi = project(image, to_q, to_k, to_v, q_rms_norm, k_rms_norm, heads, head_dim);
  auto pt = project(text, to_q_t, to_k_t, to_v_t, q_rms_norm_t, k_rms_norm_t, heads, head_dim);
  auto [oi, ot] = attend(pi, pt, in, head_dim);
  return {to_out(oi), to_out_t(ot)};
}

HiDreamImageFeedForward::HiDreamImageFeedForward(torch::nn::Module& owner,
                                                 const HiDreamBlockOptions& o) {
  if (o.num_routed_experts > 0)
    moe_ = owner.register_module(
        "ff_i",
        MOEFeedForwardSwiGLU(o.dim, 4 * o.dim, o.num_routed_experts, o.num_activated_experts));
  else
    plain_ = owner.register_module("ff_i", FeedForwardSwiGLU(o.dim, 4 * o.dim));
}

torch::Tensor HiDreamImageFeedForward::operator()(const torch::Tensor& x) const {
  if (moe_) return MOEFeedForwardSwiGLU(moe_)->forward(x);
  return FeedForwardSwiGLU(plain_)->forward(x);
}

HiDreamImageTransformerBlockImpl::HiDreamImageTransformerBlockImpl(const HiDreamBlockOptions& o) {
  adaLN_modulation = make_modulation(*this, o.dim, 12, &modulation);
  attn1 = register_module("attn1", HiDreamAttention(o.dim, o.heads, o.head_dim, /*single=*/false));
  ff_i = HiDreamImageFeedForward(*this, o);
  ff_t = register_module("ff_t", FeedForwardSwiGLU(o.dim, 4 * o.dim));
}

std::pair<torch::Tensor, torch::Tensor> HiDreamImageTransformerBlockImpl::forward(
    const torch::Tensor& image_in, const torch::Tensor& text_in, const HiDreamBlockInputs& in) {
  // shift, scale, gate for attention then MLP; image stream first, then text.
  auto m = modulation_chunks(modulation, in.adaln_input, 12);
  auto [attn_i, attn_t] = attn1->forward_dual(hidream_modulate(image_in, m[0], m[1]),
                                              hidream_modulate(text_in, m[6], m[7]), in);
  auto image = m[2] * attn_i + image_in;
  auto text = m[8] * attn_t + text_in;
  auto ff_out_i = ff_i(hidream_modulate(image, m[3], m[4]));
  auto ff_out_t = ff_t(hidream_modulate(text, m[9], m[10]));
  return {m[5] * ff_out_i + image, m[11] * ff_out_t + text};
}

HiDreamImageSingleTransformerBlockImpl::HiDreamImageSingleTransformerBlockImpl(
    const HiDreamBlockOptions& o) {
  adaLN_modulation = make_modulation(*this, o.dim, 6, &modulation);
  attn1 = register_module("attn1", HiDreamAttention(o.dim, o.heads, o.head_dim, /*single=*/true));
  ff_i = HiDreamImageFeedForward(*this, o);
}

torch::Tensor HiDreamImageSingleTransformerBlockImpl::forward(const torch::Tensor& tokens_in,
                                                              const HiDreamBlockInputs& in) {
  auto m = modulation_chunks(modulation, in.adaln_input, 6);
  auto tokens =
      m[2] * attn1->forward_single(hidream_modulate(tokens_in, m[0], m[1]), in) + tokens_in;
  return m[5] * ff_i(hidream_modulate(tokens, m[3], m[4])) + tokens;
}

}  // namespace diffuse::nn
