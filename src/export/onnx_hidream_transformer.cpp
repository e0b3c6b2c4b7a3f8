// HiDream-I1/E1's HiDreamImageTransformer2DModel as an ONNX graph: patch embedding, the
// per-block Llama caption projections and T5's, dual- and single-stream blocks with adaLN
// modulation, q/k RMSNorm over the whole width, the mixture of experts (softmax gate, top-k
// without renormalising, a shared expert), and the output head. Static shapes only: the
// rotary table, the key mask of padded (non-square) inputs and the sequence layout are
// constants of the size, computed by the engine's own functions.
#include <torch/torch.h>

#include <algorithm>

#include "diffuse/errors.h"
#include "export/onnx_components.h"
#include "export/onnx_modules.h"
#include "io/model_folder.h"
#include "models/hidream_transformer.h"
#include "nn/hidream_blocks.h"
#include "nn/moe_feed_forward.h"

namespace diffuse::onnx_export {
namespace {

constexpr int64_t kHiDreamDefaultTextTokens = 128;  // the pipelines' max_sequence_length

// What every block reads.
struct HiDreamShared {
  Value adaln, cos, sin, key_mask;  // key_mask: "" when nothing is padded
  int64_t heads = 0, head_dim = 0, dim = 0;
};

class HiDreamWriter {
 public:
  HiDreamWriter(ModuleWriter& w, HiDreamShared shared)
      : w_(w), g_(w.graph()), s_(std::move(shared)) {}

  std::vector<Value> modulation(nn::LinearImpl& linear, const std::string& name, int64_t chunks) {
    return w_.adaln_chunks(linear, name + ".adaLN_modulation.1", s_.adaln, chunks, s_.dim);
  }

  Value modulate(const Value& x, const Value& shift, const Value& scale) {
    return w_.adaln_modulate(x, shift, scale, s_.dim, nn::kHiDreamBlockNormEps);
  }

  Value swiglu(nn::FeedForwardSwiGLUImpl& ff, const std::string& name, const Value& x) {
    const auto h = g_.op(
        "Mul", {w_.silu(w_.linear(*ff.w1, name + ".w1", x)), w_.linear(*ff.w3, name + ".w3", x)});
    return w_.linear(*ff.w2, name + ".w2", h);
  }

  // Every routed expert on every token, weighted by its routing weight where the gate chose it
  // (0 elsewhere): the same sum as the engine's grouped path, written densely.
  Value moe(nn::MOEFeedForwardSwiGLUImpl& m, const std::string& name, const Value& x) {
    auto& gate = *m.gate;
    auto logits = g_.op("MatMul", {x, g_.weight(name + ".gate.weight", gate.weight.detach().t())});
    const auto scores =
        g_.op("Softmax", {g_.cast(logits, torch::kFloat32)}, {{"axis", int64_t{-1}}});
    const auto top =
        g_.op_n("TopK", {scores, g_.ints({gate.top_k}, "k")}, 2,
                {{"axis", int64_t{-1}}, {"largest", int64_t{1}}, {"sorted", int64_t{1}}});
    const auto zeros = g_.op("Mul", {scores, g_.scalar_f32(0.0, "zero")});
    const auto dense =
        g_.cast(g_.op("ScatterElements", {zeros, top[1], top[0]}, {{"axis", int64_t{-1}}}),
                g_.compute_dtype());
    auto out = swiglu(*m.shared_experts, name + ".shared_experts", x);
    for (size_t e = 0; e < m.expert_list.size(); ++e) {
      const auto weight =
          g_.op("Slice", {dense, g_.ints({static_cast<int64_t>(e)}, "start"),
                          g_.ints({static_cast<int64_t>(e) + 1}, "end"), g_.ints({-1}, "axes")});
      out = g_.op(
          "Add",
          {out, g_.op("Mul", {swiglu(*m.expert_list[e], name + ".experts." + std::to_string(e), x),
                              weight})});
    }
    return out;
  }

  Value image_ff(nn::HiDreamImageFeedForward& ff, const std::string& name, const Value& x) {
    if (auto m = ff.moe()) return moe(*m, name, x);
    return swiglu(*ff.plain(), name, x);
  }

  // q (RMSNorm over the whole width, then heads), k likewise, v: [B, N, H, D].
  std::vector<Value> project(const Value& x, nn::LinearImpl& q, nn::LinearImpl& k,
                             nn::LinearImpl& v, nn::RMSNormImpl& qn, nn::RMSNormImpl& kn,
                             const std::string& name, const std::string& suffix) {
    const auto heads = g_.ints({0, 0, s_.heads, s_.head_dim}, "heads");
    const auto split = [&](const Value& t) { return g_.op("Reshape", {t, heads}); };
    return {split(w_.rms_norm(qn, name + ".q_rms_norm" + suffix,
                              w_.linear(q, name + ".to_q" + suffix, x))),
            split(w_.rms_norm(kn, name + ".k_rms_norm" + suffix,
                              w_.linear(k, name + ".to_k" + suffix, x))),
            split(w_.linear(v, name + ".to_v" + suffix, x))};
  }

  // Joint attention over [B, N, H, D] (image first): masked keys -> [B, N, H*D].
  Value attend(const Value& q, Value k, const Value& v) {
    if (!s_.key_mask.empty()) k = g_.op("Mul", {k, s_.key_mask});
    return w_.rotary_attention(q, k, v, s_.cos, s_.sin, s_.heads, s_.head_dim);
  }

  Value slice_tokens(const Value& x, const Value& begin, const Value& end) {
    return g_.op("Slice", {x, begin, end, g_.ints({1}, "axes")});
  }

  // image [B, Ni, dim], text [B, Nt, dim] (its Llama layer appended) -> (image, text).
  std::pair<Value, Value> dual_block(nn::HiDreamImageTransformerBlockImpl& b,
                                     const std::string& name, const Value& image,
                                     const Value& text) {
    g_.set_scope(name);
    const auto m = modulation(*b.modulation, name, 12);
    auto& a = *b.attn1;
    const auto an = name + ".attn1";
    const auto pi = project(modulate(image, m[0], m[1]), *a.to_q, *a.to_k, *a.to_v, *a.q_rms_norm,
                            *a.k_rms_norm, an, "");
    const auto pt = project(modulate(text, m[6], m[7]), *a.to_q_t, *a.to_k_t, *a.to_v_t,
                            *a.q_rms_norm_t, *a.k_rms_norm_t, an, "_t");
    const Attrs along = {{"axis", int64_t{1}}};
    const auto joint =
        attend(g_.op("Concat", {pi[0], pt[0]}, along), g_.op("Concat", {pi[1], pt[1]}, along),
               g_.op("Concat", {pi[2], pt[2]}, along));
    const auto ni = g_.dims_of(image, {1});
    const auto oi = slice_tokens(joint, g_.ints({0}, "start"), ni);
    const auto ot = slice_tokens(joint, ni, g_.dims_of(joint, {1}));
    auto img =
        g_.op("Add", {g_.op("Mul", {m[2], w_.linear(*a.to_out, an + ".to_out", oi)}), image});
    auto txt =
        g_.op("Add", {g_.op("Mul", {m[8], w_.linear(*a.to_out_t, an + ".to_out_t", ot)}), text});
    img = g_.op(
        "Add",
        {g_.op("Mul", {m[5], image_ff(b.ff_i, name + ".ff_i", modulate(img, m[3], m[4]))}), img});
    txt = g_.op(
        "Add",
        {g_.op("Mul", {m[11], swiglu(*b.ff_t, name + ".ff_t", modulate(txt, m[9], m[10]))}), txt});
    return {img, txt};
  }

  Value single_block(nn::HiDreamImageSingleTransformerBlockImpl& b, const std::string& name,
                     const Value& tokens) {
    g_.set_scope(name);
    const auto m = modulation(*b.modulation, name, 6);
    auto& a = *b.attn1;
    const auto an = name + ".attn1";
    const auto p = project(modulate(tokens, m[0], m[1]), *a.to_q, *a.to_k, *a.to_v, *a.q_rms_norm,
                           *a.k_rms_norm, an, "");
    const auto attn = w_.linear(*a.to_out, an + ".to_out", attend(p[0], p[1], p[2]));
    const auto t = g_.op("Add", {g_.op("Mul", {m[2], attn}), tokens});
    return g_.op(
        "Add",
        {g_.op("Mul", {m[5], image_ff(b.ff_i, name + ".ff_i", modulate(t, m[3], m[4]))}), t});
  }

 private:
  ModuleWriter& w_;
  OnnxGraph& g_;
  HiDreamShared s_;
};

// cos/sin [total, head_dim / 2] of the joint sequence: the engine's table for the first
// `image` tokens, the identity (cos 1, sin 0) for padding, text and unrotated channels.
std::pair<torch::Tensor, torch::Tensor> joint_rope(const nn::RopeTable& table, int64_t total,
                                                   int64_t head_dim) {
  auto cos = torch::ones({total, head_dim / 2}, torch::kFloat32);
  auto sin = torch::zeros({total, head_dim / 2}, torch::kFloat32);
  const int64_t n = table.tokens(), r = table.cos.size(1);
  cos.narrow(0, 0, n).narrow(1, 0, r).copy_(table.cos.to(torch::kCPU));
  sin.narrow(0, 0, n).narrow(1, 0, r).copy_(table.sin.to(torch::kCPU));
  return {cos, sin};
}

}  // namespace

void write_hidream_transformer(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                               ExportResult& result) {
  if (r.dynamic)
    throw InvalidArgument(
        "--dynamic: HiDream's transformer exports with static shapes (its rotary table, the key "
        "mask of padded inputs and the sequence layout are constants of the size)");
  const auto dtype = g.compute_dtype();
  auto model = models::load_hidream_transformer(folder, torch::kCPU, torch::kFloat32, r.component);
  auto& m = *model;
  const auto& c = m.config();
  const int64_t p = c.patch_size, factor = vae_factor(folder);
  const auto [height, width] = image_size(r, folder, factor * p);
  const int64_t lh = height / factor, lw = width / factor, pH = lh / p, pW = lw / p;
  const int64_t n_img = pH * pW;
  // Square latents run unpadded; others are padded to max_seq image tokens (as the engine).
  const int64_t max_seq = r.max_seq > 0 ? r.max_seq : c.max_seq();
  if (n_img > max_seq)
    throw InvalidArgument("--height/--width: " + std::to_string(n_img) +
                          " image tokens, more than max_seq " + std::to_string(max_seq) +
                          " (HiDream-E1's side-by-side input: --max-seq " + std::to_string(n_img) +
                          ")");
  const int64_t image_len = lh != lw && max_seq > n_img ? max_seq : n_img;
  const int64_t tokens = r.tokens > 0 ? r.tokens : kHiDreamDefaultTextTokens;
  const int64_t llama_layers = *std::max_element(c.llama_layers.begin(), c.llama_layers.end()) + 1;
  const int64_t B = r.batch, D = c.inner_dim();
  const int64_t blocks = c.num_layers + c.num_single_layers;
  // The joint sequence of every block: image | T5 | last Llama layer | the block's Llama layer.
  const int64_t total = image_len + 3 * tokens;
  Io io{g, result};
  ModuleWriter w(g);

  const auto x = io.in("hidden_states", dtype, {B, c.in_channels, lh, lw});
  const auto timesteps = io.in("timesteps", torch::kFloat32, {B});
  const auto t5 = io.in("encoder_hidden_states_t5", dtype, {B, tokens, c.caption_channels[0]});
  const auto llama = io.in("encoder_hidden_states_llama3", dtype,
                           {llama_layers, B, tokens, c.caption_channels[1]});
  const auto pooled = io.in("pooled_embeds", dtype, {B, c.text_emb_dim});

  g.set_scope("x_embedder");
  // [B, C, H, W] -> [B, pH * pW, p * p * C], features (py, px, c).
  auto patches =
      g.op("Transpose", {g.op("Reshape", {x, g.ints({B, c.in_channels, pH, p, pW, p}, "grid")})},
           {{"perm", std::vector<int64_t>{0, 2, 4, 3, 5, 1}}});
  patches = g.op("Reshape", {patches, g.ints({B, n_img, p * p * c.in_channels}, "tokens")});
  Value key_mask;
  if (image_len > n_img) {
    patches = g.op("Pad", {patches, g.ints({0, 0, 0, 0, image_len - n_img, 0}, "pads")});
    auto mask = torch::ones({1, total, 1, 1}, torch::kFloat32);
    mask.narrow(1, n_img, image_len - n_img).zero_();
    key_mask = g.tensor_const(mask.to(dtype), "key_mask");
  }
  auto image = w.linear(*m.x_proj, "x_embedder.proj", patches);

  g.set_scope("t_embedder");
  const auto t_emb = w.timestep_embedding(*m.timestep_embedder, "t_embedder.timestep_embedder",
                                          g.cast(w.timesteps(*m.time_proj, timesteps), dtype));
  const auto p_emb = w.timestep_embedding(*m.pooled_embedder, "p_embedder.pooled_embedder", pooled);
  const auto adaln = g.op("Add", {t_emb, p_emb});

  g.set_scope("caption_projection");
  std::vector<Value> llama_proj;
  for (int64_t i = 0; i < blocks; ++i) {
    const auto layer = g.op(
        "Gather",
        {llama, g.tensor_const(torch::scalar_tensor(c.llama_layers[i], torch::kInt64), "layer")},
        {{"axis", int64_t{0}}});
    llama_proj.push_back(w.linear(*m.caption_linear[i],
                                  "caption_projection." + std::to_string(i) + ".linear", layer));
  }
  const auto t5_proj = w.linear(*m.caption_linear[blocks],
                                "caption_projection." + std::to_string(blocks) + ".linear", t5);
  auto text = g.op("Concat", {t5_proj, llama_proj.back()}, {{"axis", int64_t{1}}});

  g.set_scope("pe_embedder");
  const auto [cos, sin] =
      joint_rope(models::hidream_image_rope(c, pH, pW, torch::kCPU), total, c.attention_head_dim);
  HiDreamWriter h(w, {adaln, g.tensor_const(cos, "rope_cos"), g.tensor_const(sin, "rope_sin"),
                      key_mask, c.num_attention_heads, c.attention_head_dim, D});
  const Attrs along = {{"axis", int64_t{1}}};
  const auto text_len = g.ints({2 * tokens}, "text_len");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const auto name = "double_stream_blocks." + std::to_string(i) + ".block";
    Value txt;
    std::tie(image, txt) = h.dual_block(*m.double_blocks[i], name, image,
                                        g.op("Concat", {text, llama_proj[i]}, along));
    text = h.slice_tokens(txt, g.ints({0}, "start"), text_len);
  }
  auto joint = g.op("Concat", {image, text}, along);
  const auto joint_len = g.ints({image_len + 2 * tokens}, "joint_len");
  for (int64_t j = 0; j < c.num_single_layers; ++j) {
    const auto out =
        h.single_block(*m.single_blocks[j], "single_stream_blocks." + std::to_string(j) + ".block",
                       g.op("Concat", {joint, llama_proj[c.num_layers + j]}, along));
    joint = h.slice_tokens(out, g.ints({0}, "start"), joint_len);
  }

  g.set_scope("final_layer");
  const auto mod =
      w.adaln_chunks(*m.final_modulation, "final_layer.adaLN_modulation.1", adaln, 2, D);
  const auto image_out = h.slice_tokens(joint, g.ints({0}, "start"), g.ints({n_img}, "n_img"));
  const auto out =
      w.linear(*m.final_linear, "final_layer.linear", h.modulate(image_out, mod[0], mod[1]));
  // [B, pH * pW, p * p * C] -> [B, C, H, W].
  auto grid = g.op("Reshape", {out, g.ints({B, pH, pW, p, p, c.out_channels}, "grid")});
  grid = g.op("Transpose", {grid}, {{"perm", std::vector<int64_t>{0, 5, 1, 3, 2, 4}}});
  io.out("out_hidden_states", g.op("Reshape", {grid, g.ints({B, c.out_channels, lh, lw}, "image")}),
         dtype, {B, c.out_channels, lh, lw});
  check_all_exported(m, g, "", r.component);
}

}  // namespace diffuse::onnx_export
