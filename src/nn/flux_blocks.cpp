#include "nn/flux_blocks.h"

#include <torch/torch.h>

#include "diffuse/errors.h"
#include "nn/attention.h"
#include "nn/fused_ops.h"
#include "parallel/ulysses.h"

namespace diffuse::nn {
namespace {

struct FluxQkv {
  torch::Tensor q, k, v;  // [B, N, H, D]
};

FluxQkv project_heads(const torch::Tensor& x, nn::Linear to_q, nn::Linear to_k, nn::Linear to_v,
                      RMSNorm q_norm, RMSNorm k_norm, int64_t heads, int64_t head_dim) {
  const int64_t B = x.size(0), N = x.size(1);
  // The norms run per head (RMSNorm(head_dim)), unlike HiDream's over the whole width.
  return {q_norm(to_q(x).view({B, N, heads, head_dim})),
          k_norm(to_k(x).view({B, N, heads, head_dim})), to_v(x).view({B, N, heads, head_dim})};
}

// Rotates q and k over the joint sequence and attends; [B, N, H, D] -> [B, N, H*D].
torch::Tensor rotary_attention(torch::Tensor q, torch::Tensor k, const torch::Tensor& v,
                               const FluxBlockInputs& in) {
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2), D = q.size(3);
  if (in.rope) {
    q = apply_rope(q, *in.rope);
    k = apply_rope(k, *in.rope);
  }
  auto o = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), {});
  return o.transpose(1, 2).reshape({B, N, H * D});
}

FluxQkv flux_tokens_of(const FluxQkv& p, int64_t first, int64_t count) {
  return {p.q.narrow(1, first, count), p.k.narrow(1, first, count), p.v.narrow(1, first, count)};
}

// Joint attention over [text | image] -> (image out, text out), each [B, N, H*D]. With Ulysses,
// `image` holds this rank's tokens: they are traded for all image tokens of this rank's heads
// (the text, held whole by every rank, keeps those heads), and the outputs traded back.
std::pair<torch::Tensor, torch::Tensor> flux_attend(const FluxQkv& image, const FluxQkv& text,
                                                    const FluxBlockInputs& in) {
  if (!in.ulysses) {
    const int64_t Ni = image.q.size(1), Nt = text.q.size(1);
    // Text first: the rotary table's rows follow cat(txt_ids, img_ids).
    auto o = rotary_attention(torch::cat({text.q, image.q}, 1), torch::cat({text.k, image.k}, 1),
                              torch::cat({text.v, image.v}, 1), in);
    return {o.narrow(1, Nt, Ni), o.narrow(1, 0, Nt)};
  }
  return in.ulysses->attend_joint(
      {image.q, image.k, image.v}, {text.q, text.k, text.v}, /*text_first=*/true,
      [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
        return rotary_attention(q, k, v, in);
      });
}

}  // namespace

torch::Tensor flux_modulate(const torch::Tensor& x, const torch::Tensor& shift,
                            const torch::Tensor& scale) {
  return layer_norm(x, {}, {}, kFluxNormEps) * (1 + scale) + shift;
}

FluxModulationImpl::FluxModulationImpl(int64_t dim, int64_t chunks, const char* linear_name)
    : chunks(chunks) {
  linear = register_module(linear_name, make_linear(dim, chunks * dim));
}

std::vector<torch::Tensor> FluxModulationImpl::forward(const torch::Tensor& temb) {
  return linear(torch::silu(temb)).unsqueeze(1).chunk(chunks, -1);
}

FluxAttentionImpl::FluxAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, bool context)
    : heads(heads), head_dim(head_dim) {
  const int64_t inner = heads * head_dim;
  to_q = register_module("to_q", make_linear(dim, inner));
  to_k = register_module("to_k", make_linear(dim, inner));
  to_v = register_module("to_v", make_linear(dim, inner));
  norm_q = register_module("norm_q", RMSNorm(head_dim, kFluxNormEps));
  norm_k = register_module("norm_k", RMSNorm(head_dim, kFluxNormEps));
  if (!context) return;
  // diffusers: to_out = ModuleList([Linear, Dropout]), hence "to_out.0".
  auto out_list = register_module("to_out", torch::nn::ModuleList());
  to_out = make_linear(inner, dim);
  out_list->push_back(to_out);
  add_q_proj = register_module("add_q_proj", make_linear(dim, inner));
  add_k_proj = register_module("add_k_proj", make_linear(dim, inner));
  add_v_proj = register_module("add_v_proj", make_linear(dim, inner));
  norm_added_q = register_module("norm_added_q", RMSNorm(head_dim, kFluxNormEps));
  norm_added_k = register_module("norm_added_k", RMSNorm(head_dim, kFluxNormEps));
  to_add_out = register_module("to_add_out", make_linear(inner, dim));
}

torch::Tensor FluxAttentionImpl::forward_single(const torch::Tensor& tokens,
                                                const FluxBlockInputs& in) {
  auto p = project_heads(tokens, to_q, to_k, to_v, norm_q, norm_k, heads, head_dim);
  if (!in.ulysses) return rotary_attention(p.q, p.k, p.v, in);
  // The text comes first, then this rank's image tokens.
  const int64_t N = tokens.size(1), Nt = N - in.ulysses->rows().count;
  auto [oi, ot] = flux_attend(flux_tokens_of(p, Nt, N - Nt), flux_tokens_of(p, 0, Nt), in);
  return torch::cat({ot, oi}, 1);
}

std::pair<torch::Tensor, torch::Tensor> FluxAttentionImpl::forward_joint(
    const torch::Tensor& image, const torch::Tensor& text, const FluxBlockInputs& in) {
  if (!to_add_out)
    throw InvalidArgument("FluxAttention: a single-stream attention has no text path");
  auto pi = project_heads(image, to_q, to_k, to_v, norm_q, norm_k, heads, head_dim);
  auto pt = project_heads(text, add_q_proj, add_k_proj, add_v_proj, norm_added_q, norm_added_k,
                          heads, head_dim);
  auto [oi, ot] = flux_attend(pi, pt, in);
  return {to_out(oi), to_add_out(ot)};
}

FluxFeedForwardImpl::FluxFeedForwardImpl(int64_t dim, int64_t hidden) {
  // diffusers: net = [GELU(dim, hidden) (holding .proj), Dropout, Linear(hidden, dim)].
  auto net = register_module("net", torch::nn::ModuleList());
  auto gelu = std::make_shared<torch::nn::Module>();
  proj = gelu->register_module("proj", make_linear(dim, hidden));
  net->push_back(gelu);
  net->push_back(torch::nn::Dropout(0.0));
  out = make_linear(hidden, dim);
  net->push_back(out);
}

torch::Tensor FluxFeedForwardImpl::forward(const torch::Tensor& x) {
  return out(torch::gelu(proj(x), "tanh"));
}

FluxTransformerBlockImpl::FluxTransformerBlockImpl(const FluxBlockOptions& o) {
  const auto& n = o.names;
  norm1 = register_module(n.image_mod, FluxModulation(o.dim, 6, n.mod_linear));
  norm1_context = register_module(n.text_mod, FluxModulation(o.dim, 6, n.mod_linear));
  attn = register_module("attn", FluxAttention(o.dim, o.heads, o.head_dim, /*context=*/true));
  const auto hidden = static_cast<int64_t>(o.dim * o.mlp_ratio);
  ff = register_module(n.image_ff, FluxFeedForward(o.dim, hidden));
  ff_context = register_module(n.text_ff, FluxFeedForward(o.dim, hidden));
  clip_image_fp16 = o.clip_image_fp16;
}

std::pair<torch::Tensor, torch::Tensor> FluxTransformerBlockImpl::forward(
    const torch::Tensor& image_in, const torch::Tensor& text_in, const FluxBlockInputs& in) {
  // shift, scale, gate for attention, then for the MLP.
  auto m = norm1(in.temb);
  auto c = norm1_context(in.temb);
  auto [attn_i, attn_t] = attn->forward_joint(flux_modulate(image_in, m[0], m[1]),
                                              flux_modulate(text_in, c[0], c[1]), in);
  auto image = image_in + m[2] * attn_i;
  auto text = text_in + c[2] * attn_t;
  image = image + m[5] * ff(flux_modulate(image, m[3], m[4]));
  text = text + c[5] * ff_context(flux_modulate(text, c[3], c[4]));
  if (text.scalar_type() == torch::kFloat16) text = text.clamp(-65504, 65504);
  if (image.scalar_type() == torch::kFloat16 && clip_image_fp16) image = image.clamp(-65504, 65504);
  return {image, text};
}

FluxSingleTransformerBlockImpl::FluxSingleTransformerBlockImpl(const FluxBlockOptions& o) {
  norm = register_module("norm", FluxModulation(o.dim, 3));
  attn = register_module("attn", FluxAttention(o.dim, o.heads, o.head_dim, /*context=*/false));
  const auto hidden = static_cast<int64_t>(o.dim * o.mlp_ratio);
  proj_mlp = register_module("proj_mlp", make_linear(o.dim, hidden));
  proj_out = register_module("proj_out", make_linear(o.dim + hidden, o.dim));
}

torch::Tensor FluxSingleTransformerBlockImpl::forward(const torch::Tensor& tokens,
                                                      const FluxBlockInputs& in) {
  auto m = norm(in.temb);  // shift, scale, gate
  auto x = flux_modulate(tokens, m[0], m[1]);
  auto mlp = torch::gelu(proj_mlp(x), "tanh");
  auto out = tokens + m[2] * proj_out(torch::cat({attn->forward_single(x, in), mlp}, -1));
  if (out.scalar_type() == torch::kFloat16) out = out.clamp(-65504, 65504);
  return out;
}

}  // namespace diffuse::nn
