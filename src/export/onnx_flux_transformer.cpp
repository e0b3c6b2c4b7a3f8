// FLUX.1's FluxTransformer2DModel (dev, schnell, Kontext) as an ONNX graph: the embedders, the
// double-stream and single-stream blocks with their adaLN modulation, per-head q/k RMSNorm and
// the 3-axis rotary embedding computed in the graph from img_ids / txt_ids (so one file serves
// any position layout of its sequence length, Kontext's source tokens included), the joint
// [text | image] attention as MatMul/Softmax, and the output head.
#include <torch/torch.h>

#include "diffuse/errors.h"
#include "export/onnx_components.h"
#include "export/onnx_modules.h"
#include "io/model_folder.h"
#include "models/flux_transformer.h"

namespace diffuse::onnx_export {
namespace {

constexpr int64_t kFluxDefaultTextTokens = 512;  // FLUX.1-dev's max_sequence_length

// What every block reads: the conditioning embedding and the rotary table of the joint
// sequence.
struct FluxShared {
  Value temb, cos, sin;
  int64_t heads = 0, head_dim = 0, dim = 0;
};

class FluxWriter {
 public:
  FluxWriter(ModuleWriter& w, FluxShared shared) : w_(w), g_(w.graph()), s_(std::move(shared)) {}

  // AdaLayerNormZero(-Single): `chunks` values [B, 1, dim] from the conditioning.
  std::vector<Value> modulation(nn::FluxModulationImpl& m, const std::string& name) {
    return w_.adaln_chunks(*m.linear, name + ".linear", s_.temb, m.chunks, s_.dim);
  }

  Value modulate(const Value& x, const Value& shift, const Value& scale) {
    return w_.adaln_modulate(x, shift, scale, s_.dim, nn::kFluxNormEps);
  }

  // [B, N, dim] -> q, k (RMSNorm per head), v as [B, N, H, D].
  std::vector<Value> heads(const Value& x, nn::LinearImpl& q, nn::LinearImpl& k, nn::LinearImpl& v,
                           nn::RMSNormImpl& qn, nn::RMSNormImpl& kn, const std::string& name,
                           const std::string& qname, const std::string& kname,
                           const std::string& vname, const std::string& qnorm,
                           const std::string& knorm) {
    const auto shape = g_.ints({0, 0, s_.heads, s_.head_dim}, "heads");
    const auto split = [&](nn::LinearImpl& l, const std::string& n) {
      return g_.op("Reshape", {w_.linear(l, name + "." + n, x), shape});
    };
    return {w_.rms_norm(qn, name + "." + qnorm, split(q, qname)),
            w_.rms_norm(kn, name + "." + knorm, split(k, kname)), split(v, vname)};
  }

  Value attend(const Value& q, const Value& k, const Value& v) {
    return w_.rotary_attention(q, k, v, s_.cos, s_.sin, s_.heads, s_.head_dim);
  }

  Value feed_forward(nn::FluxFeedForwardImpl& ff, const std::string& name, const Value& x) {
    return w_.linear(*ff.out, name + ".net.2",
                     w_.gelu(w_.linear(*ff.proj, name + ".net.0.proj", x), true));
  }

  // One double-stream block: (image, text) -> (image, text).
  std::pair<Value, Value> double_block(nn::FluxTransformerBlockImpl& b, const std::string& name,
                                       const Value& image, const Value& text) {
    g_.set_scope(name);
    const auto m = modulation(*b.norm1, name + ".norm1");
    const auto c = modulation(*b.norm1_context, name + ".norm1_context");
    auto& a = *b.attn;
    const auto an = name + ".attn";
    const auto pi = heads(modulate(image, m[0], m[1]), *a.to_q, *a.to_k, *a.to_v, *a.norm_q,
                          *a.norm_k, an, "to_q", "to_k", "to_v", "norm_q", "norm_k");
    const auto pt = heads(modulate(text, c[0], c[1]), *a.add_q_proj, *a.add_k_proj, *a.add_v_proj,
                          *a.norm_added_q, *a.norm_added_k, an, "add_q_proj", "add_k_proj",
                          "add_v_proj", "norm_added_q", "norm_added_k");
    const Attrs along_tokens = {{"axis", int64_t{1}}};
    const auto joint = attend(g_.op("Concat", {pt[0], pi[0]}, along_tokens),
                              g_.op("Concat", {pt[1], pi[1]}, along_tokens),
                              g_.op("Concat", {pt[2], pi[2]}, along_tokens));
    // Text first: split the joint output back at the text length.
    const auto text_len = g_.dims_of(text, {1});
    const auto total = g_.dims_of(joint, {1});
    const auto ot = g_.op("Slice", {joint, g_.ints({0}, "start"), text_len, g_.ints({1}, "axes")});
    const auto oi = g_.op("Slice", {joint, text_len, total, g_.ints({1}, "axes")});
    auto img =
        g_.op("Add", {image, g_.op("Mul", {m[2], w_.linear(*a.to_out, an + ".to_out.0", oi)})});
    auto txt = g_.op(
        "Add", {text, g_.op("Mul", {c[2], w_.linear(*a.to_add_out, an + ".to_add_out", ot)})});
    img = g_.op(
        "Add",
        {img, g_.op("Mul", {m[5], feed_forward(*b.ff, name + ".ff", modulate(img, m[3], m[4]))})});
    txt = g_.op("Add", {txt, g_.op("Mul", {c[5], feed_forward(*b.ff_context, name + ".ff_context",
                                                              modulate(txt, c[3], c[4]))})});
    return {img, txt};
  }

  Value single_block(nn::FluxSingleTransformerBlockImpl& b, const std::string& name,
                     const Value& tokens) {
    g_.set_scope(name);
    const auto m = modulation(*b.norm, name + ".norm");
    const auto x = modulate(tokens, m[0], m[1]);
    auto& a = *b.attn;
    const auto p = heads(x, *a.to_q, *a.to_k, *a.to_v, *a.norm_q, *a.norm_k, name + ".attn", "to_q",
                         "to_k", "to_v", "norm_q", "norm_k");
    const auto mlp = w_.gelu(w_.linear(*b.proj_mlp, name + ".proj_mlp", x), true);
    const auto both = g_.op("Concat", {attend(p[0], p[1], p[2]), mlp}, {{"axis", int64_t{-1}}});
    return g_.op("Add",
                 {tokens, g_.op("Mul", {m[2], w_.linear(*b.proj_out, name + ".proj_out", both)})});
  }

 private:
  ModuleWriter& w_;
  OnnxGraph& g_;
  FluxShared s_;
};

}  // namespace

void write_flux_transformer(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                            ExportResult& result) {
  const auto dtype = g.compute_dtype();
  const int64_t factor = vae_factor(folder);
  const auto [height, width] = image_size(r, folder, 2 * factor);
  auto model = models::load_flux_transformer(folder, torch::kCPU, torch::kFloat32, r.component);
  auto& m = *model;
  const auto& c = m.config();
  if (c.patch_size != 1)
    throw InvalidArgument("ONNX export: FLUX transformers with patch_size " +
                          std::to_string(c.patch_size) + " are not exported (FLUX.1 has 1)");
  int64_t rotated = 0;
  for (auto d : c.axes_dims_rope) rotated += d;
  if (rotated != c.attention_head_dim)
    throw InvalidArgument("ONNX export: axes_dims_rope sum to " + std::to_string(rotated) +
                          ", not the head width " + std::to_string(c.attention_head_dim));
  const int64_t tokens = r.tokens > 0 ? r.tokens : kFluxDefaultTextTokens;
  const int64_t image_tokens = (height / (2 * factor)) * (width / (2 * factor));
  const Shapes s{r.dynamic};
  const auto B = s.dim(r.batch, "batch");
  const auto S = s.dim(image_tokens, "image_tokens");
  const auto L = s.dim(tokens, "sequence");
  const int64_t axes = static_cast<int64_t>(c.axes_dims_rope.size());
  Io io{g, result};
  ModuleWriter w(g);

  const auto hidden = io.in("hidden_states", dtype, {B, S, c.in_channels});
  const auto context = io.in("encoder_hidden_states", dtype, {B, L, c.joint_attention_dim});
  const auto pooled = io.in("pooled_projections", dtype, {B, c.pooled_projection_dim});
  const auto timestep = io.in("timestep", torch::kFloat32, {B});
  const auto img_ids = io.in("img_ids", torch::kFloat32, {S, axes});
  const auto txt_ids = io.in("txt_ids", torch::kFloat32, {L, axes});
  Value guidance;
  if (c.guidance_embeds) guidance = io.in("guidance", torch::kFloat32, {B});

  // The conditioning: sinusoids of t * 1000 (and guidance * 1000) in float32, the pooled text.
  g.set_scope("time_text_embed");
  const auto embed = [&](nn::TimestepEmbeddingImpl& mlp, const std::string& name, const Value& t) {
    const auto scaled = g.op("Mul", {t, g.scalar_f32(1000.0, "thousand")});
    return w.timestep_embedding(mlp, name, g.cast(w.timesteps(*m.time_proj, scaled), dtype));
  };
  auto temb = embed(*m.timestep_embedder, "time_text_embed.timestep_embedder", timestep);
  if (c.guidance_embeds)
    temb = g.op("Add",
                {temb, embed(*m.guidance_embedder, "time_text_embed.guidance_embedder", guidance)});
  temb =
      g.op("Add",
           {temb, w.timestep_embedding(*m.text_embedder, "time_text_embed.text_embedder", pooled)});

  g.set_scope("pos_embed");
  const auto ids = g.op("Concat", {txt_ids, img_ids}, {{"axis", int64_t{0}}});
  const auto [cos, sin] = w.rope_angles(ids, c.axes_dims_rope, models::kFluxRopeTheta);

  g.set_scope("x_embedder");
  auto image = w.linear(*m.x_embedder, "x_embedder", hidden);
  g.set_scope("context_embedder");
  auto text = w.linear(*m.context_embedder, "context_embedder", context);

  FluxWriter f(w, {temb, cos, sin, c.num_attention_heads, c.attention_head_dim, c.inner_dim()});
  for (size_t i = 0; i < m.double_blocks.size(); ++i)
    std::tie(image, text) =
        f.double_block(*m.double_blocks[i], "transformer_blocks." + std::to_string(i), image, text);
  auto joint = g.op("Concat", {text, image}, {{"axis", int64_t{1}}});
  for (size_t j = 0; j < m.single_blocks.size(); ++j)
    joint = f.single_block(*m.single_blocks[j], "single_transformer_blocks." + std::to_string(j),
                           joint);
  g.set_scope("norm_out");
  image = g.op("Slice", {joint, g.dims_of(text, {1}), g.dims_of(joint, {1}), g.ints({1}, "axes")});
  // AdaLayerNormContinuous: (scale, shift).
  const auto mod = w.adaln_chunks(*m.norm_out_linear, "norm_out.linear", temb, 2, c.inner_dim());
  const auto normed = w.adaln_modulate(image, mod[1], mod[0], c.inner_dim(), nn::kFluxNormEps);
  g.set_scope("proj_out");
  io.out("out_hidden_states", w.linear(*m.proj_out, "proj_out", normed), dtype,
         {B, S, c.out_channels});
  check_all_exported(m, g, "", r.component);
}

}  // namespace diffuse::onnx_export
