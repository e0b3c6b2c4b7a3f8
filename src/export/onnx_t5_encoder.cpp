// T5EncoderModel (FLUX.1's text_encoder_2, HiDream's text_encoder_3) as an ONNX graph: the
// shared embedding, pre-norm blocks of unscaled self-attention with block 0's relative
// position bias (bucketed in the graph from the sequence length, so --dynamic works), the
// gated-GELU (tanh form) or ReLU feed-forward, T5LayerNorm with float32 statistics.
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "diffuse/errors.h"
#include "export/onnx_components.h"
#include "export/onnx_modules.h"
#include "io/model_folder.h"
#include "models/t5_encoder.h"

namespace diffuse::onnx_export {
namespace {

// transformers' bidirectional _relative_position_bucket on the (key - query) offsets of a
// sequence of `n` tokens ([] int64), as models::T5AttentionImpl::compute_bias: half the
// buckets per sign, exact buckets below max_exact, log-spaced (float32) up to max_distance.
Value relative_buckets(OnnxGraph& g, const models::T5Config& c, const Value& n) {
  const int64_t half = c.relative_attention_num_buckets / 2;
  const int64_t max_exact = half / 2;
  const auto positions = g.op("Range", {g.scalar_int(0, "start"), n, g.scalar_int(1, "step")});
  const auto keys = g.op("Unsqueeze", {positions, g.ints({0}, "axis0")});
  const auto queries = g.op("Unsqueeze", {positions, g.ints({1}, "axis1")});
  const auto rel = g.op("Sub", {keys, queries});  // [N, N]
  const auto sign_bucket = g.op(
      "Mul",
      {g.cast(g.op("Greater", {rel, g.ints({0}, "zero")}), torch::kInt64), g.ints({half}, "half")});
  const auto distance = g.op("Abs", {rel});
  const auto is_small = g.op("Less", {distance, g.ints({max_exact}, "max_exact")});
  // Offsets below max_exact take the exact bucket; the log is taken of at least 1 so that the
  // unused entries stay finite (the engine's log(0) = -inf is discarded the same way).
  const auto at_least_one = g.op("Max", {distance, g.ints({1}, "one")});
  auto log_ratio =
      g.op("Log", {g.op("Div", {g.cast(at_least_one, torch::kFloat32),
                                g.scalar_f32(static_cast<double>(max_exact), "max_exact_f")})});
  log_ratio = g.op(
      "Div",
      {log_ratio, g.scalar_f32(std::log(static_cast<double>(c.relative_attention_max_distance) /
                                        static_cast<double>(max_exact)),
                               "log_range")});
  log_ratio =
      g.op("Mul", {log_ratio, g.scalar_f32(static_cast<double>(half - max_exact), "log_buckets")});
  // Cast truncates toward zero, as the engine's .to(kInt64).
  auto large = g.op("Add", {g.ints({max_exact}, "max_exact"), g.cast(log_ratio, torch::kInt64)});
  large = g.op("Min", {large, g.ints({half - 1}, "last_bucket")});
  return g.op("Add", {sign_bucket, g.op("Where", {is_small, distance, large})});
}

}  // namespace

void write_t5_encoder(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                      ExportResult& result) {
  if (g.compute_dtype() != torch::kFloat32)
    throw InvalidArgument(
        "ONNX export of " + r.component +
        " (T5): --precision fp16 is refused: T5's activations overflow float16 in its later "
        "blocks (transformers clamps them and still degrades); export fp32 and keep it in fp32 "
        "(ATC: --precision_mode=must_keep_origin_dtype)");
  const auto dtype = g.compute_dtype();
  auto model = models::load_t5_encoder(folder, r.component, torch::kCPU, torch::kFloat32);
  auto& m = *model;
  const auto& c = m.config();
  // FLUX.1 pads its prompt to 512 tokens (dev; 256 for schnell), HiDream to 128.
  const int64_t tokens = r.tokens > 0 ? r.tokens : 512;
  const Shapes s{r.dynamic};
  const auto B = s.dim(r.batch, "batch");
  const auto S = s.dim(tokens, "sequence");
  Io io{g, result};
  ModuleWriter w(g);
  const auto ids = io.in("input_ids", torch::kInt64, {B, S});
  const auto mask = io.in("attention_mask", torch::kInt64, {B, S});

  g.set_scope("shared");
  auto h =
      g.op("Gather", {g.weight("shared.weight", m.shared->weight), ids}, {{"axis", int64_t{0}}});
  g.set_scope("encoder.block.0.layer.0.SelfAttention.relative_attention_bias");
  auto first = m.encoder->block[0]
                   ->as<models::T5Block>()
                   ->layer[0]
                   ->as<models::T5LayerSelfAttention>()
                   ->SelfAttention;
  const auto n = g.op("Squeeze", {g.dims_of(ids, {1}), g.ints({0}, "axis0")});
  const auto buckets = relative_buckets(g, c, n);
  auto bias = g.op("Gather",
                   {g.weight("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                             first->relative_attention_bias->weight),
                    buckets},
                   {{"axis", int64_t{0}}});  // [N, N, H]
  bias = g.op("Transpose", {bias}, {{"perm", std::vector<int64_t>{2, 0, 1}}});
  bias = g.op("Unsqueeze", {bias, g.ints({0}, "axis0")});  // [1, H, N, N]
  // transformers' extended mask on the keys: (1 - mask) * finfo(dtype).min.
  const auto keep = g.cast(mask, dtype);
  auto padding = g.op("Mul", {g.op("Sub", {g.scalar(1.0, "one"), keep}),
                              g.scalar(std::numeric_limits<float>::lowest(), "masked")});
  padding = g.op("Unsqueeze", {padding, g.ints({1, 2}, "axes12")});  // [B, 1, 1, N]
  bias = g.op("Add", {bias, padding});

  for (size_t i = 0; i < m.encoder->block->size(); ++i) {
    const auto name = "encoder.block." + std::to_string(i);
    auto block = m.encoder->block[i]->as<models::T5Block>();
    auto attn = block->layer[0]->as<models::T5LayerSelfAttention>();
    auto ff = block->layer[1]->as<models::T5LayerFF>();
    g.set_scope(name + ".layer.0");
    const auto an = name + ".layer.0.SelfAttention";
    auto& sa = *attn->SelfAttention;
    const auto x = w.rms_norm_f32(attn->layer_norm->weight, attn->layer_norm->eps,
                                  name + ".layer.0.layer_norm", h);
    const auto q = w.split_heads(w.linear(*sa.q, an + ".q", x), c.num_heads, c.d_kv);
    const auto k = w.split_heads(w.linear(*sa.k, an + ".k", x), c.num_heads, c.d_kv);
    const auto v = w.split_heads(w.linear(*sa.v, an + ".v", x), c.num_heads, c.d_kv);
    // No 1/sqrt(d) scaling: T5 folds it into its initialisation.
    const auto a = w.merge_heads(w.attention(q, k, v, 1.0, false, bias), c.num_heads, c.d_kv);
    h = g.op("Add", {h, w.linear(*sa.o, an + ".o", a)});

    g.set_scope(name + ".layer.1");
    const auto fn = name + ".layer.1.DenseReluDense";
    auto& d = *ff->DenseReluDense;
    const auto y = w.rms_norm_f32(ff->layer_norm->weight, ff->layer_norm->eps,
                                  name + ".layer.1.layer_norm", h);
    const auto activate = [&](const Value& v) {
      return d.act == "relu" ? g.op("Relu", {v}) : w.gelu(v, /*tanh_approximation=*/true);
    };
    const auto hidden = d.wi_0 ? g.op("Mul", {activate(w.linear(*d.wi_0, fn + ".wi_0", y)),
                                              w.linear(*d.wi_1, fn + ".wi_1", y)})
                               : activate(w.linear(*d.wi, fn + ".wi", y));
    h = g.op("Add", {h, w.linear(*d.wo, fn + ".wo", hidden)});
  }
  g.set_scope("encoder.final_layer_norm");
  h = w.rms_norm_f32(m.encoder->final_layer_norm->weight, m.encoder->final_layer_norm->eps,
                     "encoder.final_layer_norm", h);
  io.out("last_hidden_state", h, dtype, {B, S, c.d_model});
  check_all_exported(m, g, "", r.component);
}

}  // namespace diffuse::onnx_export
