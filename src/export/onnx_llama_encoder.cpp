// LlamaForCausalLM as a text encoder (HiDream's text_encoder_4, Llama-3.1-8B-Instruct) as an ONNX
// graph: every hidden state transformers returns (the embeddings, each layer's output, the
// last one normed), which HiDream's transformer takes by layer index. Rotary positions are
// computed in the graph from the sequence length with the engine's inverse frequencies (the
// llama3 rope scaling included) as a constant; grouped-query attention repeats each key/value
// head; the causal and padding masks are additive.
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "diffuse/errors.h"
#include "export/onnx_components.h"
#include "export/onnx_modules.h"
#include "io/model_folder.h"
#include "models/llama.h"

namespace diffuse::onnx_export {
namespace {

// x * cos + rotate_half(x) * sin over [B, H, N, D], halves (x1, x2) -> (-x2, x1).
Value rotate(OnnxGraph& g, const Value& x, const Value& cos, const Value& sin, int64_t head_dim) {
  const auto halves = g.op_n("Split", {x, g.ints({head_dim / 2, head_dim / 2}, "halves")}, 2,
                             {{"axis", int64_t{-1}}});
  const auto rotated =
      g.op("Concat", {g.op("Neg", {halves[1]}), halves[0]}, {{"axis", int64_t{-1}}});
  return g.op("Add", {g.op("Mul", {x, cos}), g.op("Mul", {rotated, sin})});
}

// [B, Hkv, N, D] -> [B, Hkv * groups, N, D], each head repeated `groups` times in place
// (repeat_interleave on the head axis).
Value repeat_kv(OnnxGraph& g, const Value& x, int64_t groups, int64_t heads, int64_t head_dim) {
  if (groups == 1) return x;
  const auto expanded = g.op("Unsqueeze", {x, g.ints({2}, "axis2")});  // [B, Hkv, 1, N, D]
  const auto shape =
      g.concat_ints({g.dims_of(x, {0, 1}), g.ints({groups}, "groups"), g.dims_of(x, {2, 3})});
  const auto repeated = g.op("Expand", {expanded, shape});
  return g.op("Reshape", {repeated, g.ints({0, heads, -1, head_dim}, "heads")});
}

}  // namespace

void write_llama_encoder(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                         ExportResult& result) {
  const auto dtype = g.compute_dtype();
  auto model = models::load_llama(folder, r.component, torch::kCPU, torch::kFloat32);
  auto& m = *model;
  const auto& c = m.config();
  // HiDream pads its Llama prompt to 128 tokens.
  const int64_t tokens = r.tokens > 0 ? r.tokens : 128;
  const Shapes s{r.dynamic};
  const auto B = s.dim(r.batch, "batch");
  const auto S = s.dim(tokens, "sequence");
  Io io{g, result};
  ModuleWriter w(g);
  const auto ids = io.in("input_ids", torch::kInt64, {B, S});
  const auto mask = io.in("attention_mask", torch::kInt64, {B, S});

  g.set_scope("model.rotary_emb");
  const auto n = g.op("Squeeze", {g.dims_of(ids, {1}), g.ints({0}, "axis0")});
  const auto positions = g.op("Range", {g.scalar_int(0, "start"), n, g.scalar_int(1, "step")});
  // cos/sin in float32 (transformers disables autocast for them), then the compute dtype.
  const auto freqs =
      g.op("Mul", {g.op("Unsqueeze", {g.cast(positions, torch::kFloat32), g.ints({1}, "axis1")}),
                   g.tensor_const(models::llama_inv_freq(c).unsqueeze(0), "inv_freq")});
  const auto angles = g.op("Concat", {freqs, freqs}, {{"axis", int64_t{-1}}});  // [N, D]
  const auto cos = g.cast(g.op("Cos", {angles}), dtype);
  const auto sin = g.cast(g.op("Sin", {angles}), dtype);

  // Causal (keys after the query) and padded keys, each the lowest float: added to the scores.
  g.set_scope("model.attention_mask");
  const double lowest_value = dtype == torch::kFloat16
                                  ? static_cast<double>(std::numeric_limits<c10::Half>::lowest())
                                  : static_cast<double>(std::numeric_limits<float>::lowest());
  const auto lowest = g.scalar(lowest_value, "masked");
  const auto zero = g.scalar(0.0, "zero");
  const auto future = g.op("Greater", {g.op("Unsqueeze", {positions, g.ints({0}, "axis0")}),
                                       g.op("Unsqueeze", {positions, g.ints({1}, "axis1")})});
  const auto causal = g.op("Where", {future, lowest, zero});  // [N, N]
  const auto padded =
      g.op("Mul", {g.op("Sub", {g.scalar(1.0, "one"), g.cast(mask, dtype)}), lowest});  // [B, N]
  const auto bias = g.op("Add", {causal, g.op("Unsqueeze", {padded, g.ints({1, 2}, "axes12")})});

  g.set_scope("model.embed_tokens");
  auto h =
      g.op("Gather", {g.weight("model.embed_tokens.weight", m.model->embed_tokens->weight), ids},
           {{"axis", int64_t{0}}});
  const int64_t layers = static_cast<int64_t>(m.model->layers->size());
  const std::vector<Dim> state_dims = {B, S, c.hidden_size};
  io.out("hidden_states.0", h, dtype, state_dims);
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t i = 0; i < layers; ++i) {
    const auto name = "model.layers." + std::to_string(i);
    auto layer = m.model->layers[static_cast<size_t>(i)]->as<models::LlamaDecoderLayer>();
    auto& a = *layer->self_attn;
    g.set_scope(name + ".self_attn");
    const auto x = w.rms_norm_f32(layer->input_layernorm->weight, layer->input_layernorm->eps,
                                  name + ".input_layernorm", h);
    auto q = w.split_heads(w.linear(*a.q_proj, name + ".self_attn.q_proj", x), H, D);
    auto k = w.split_heads(w.linear(*a.k_proj, name + ".self_attn.k_proj", x), Hkv, D);
    auto v = w.split_heads(w.linear(*a.v_proj, name + ".self_attn.v_proj", x), Hkv, D);
    q = rotate(g, q, cos, sin, D);
    k = repeat_kv(g, rotate(g, k, cos, sin, D), H / Hkv, H, D);
    v = repeat_kv(g, v, H / Hkv, H, D);
    const auto attended = w.merge_heads(w.attention(q, k, v, scale, false, bias), H, D);
    h = g.op("Add", {h, w.linear(*a.o_proj, name + ".self_attn.o_proj", attended)});

    g.set_scope(name + ".mlp");
    auto& mlp = *layer->mlp;
    const auto y =
        w.rms_norm_f32(layer->post_attention_layernorm->weight,
                       layer->post_attention_layernorm->eps, name + ".post_attention_layernorm", h);
    const auto gated = g.op("Mul", {w.silu(w.linear(*mlp.gate_proj, name + ".mlp.gate_proj", y)),
                                    w.linear(*mlp.up_proj, name + ".mlp.up_proj", y)});
    h = g.op("Add", {h, w.linear(*mlp.down_proj, name + ".mlp.down_proj", gated)});
    // transformers appends the last layer's state normed.
    auto state = h;
    if (i + 1 == layers) {
      g.set_scope("model.norm");
      state = w.rms_norm_f32(m.model->norm->weight, m.model->norm->eps, "model.norm", h);
    }
    io.out("hidden_states." + std::to_string(i + 1), state, dtype, state_dims);
  }
  check_all_exported(m, g, "", r.component);
}

}  // namespace diffuse::onnx_export
