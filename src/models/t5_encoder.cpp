#include "models/t5_encoder.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/config_values.h"
#include "models/load_component.h"
#include "nn/attention.h"
#include "nn/layers.h"

namespace diffuse::models {

T5Config T5Config::from_json(const io::JsonConfig& j) {
  T5Config c;
  c.vocab_size = read_int_in(j, "vocab_size", c.vocab_size, 1, kMaxConfigVocab);
  c.d_model = read_int_in(j, "d_model", c.d_model, 1, kMaxConfigDim);
  c.d_kv = read_int_in(j, "d_kv", c.d_kv, 1, kMaxConfigDim);
  c.d_ff = read_int_in(j, "d_ff", c.d_ff, 1, kMaxConfigDim);
  c.num_layers = read_int_in(j, "num_layers", c.num_layers, 1, kMaxConfigLayers);
  c.num_heads = read_int_in(j, "num_heads", c.num_heads, 1, kMaxConfigDim);
  c.relative_attention_num_buckets = read_int_in(j, "relative_attention_num_buckets",
                                                 c.relative_attention_num_buckets, 1, 1 << 16);
  c.relative_attention_max_distance =
      read_int_in(j, "relative_attention_max_distance", c.relative_attention_max_distance, 1,
                  kMaxConfigPositions);
  c.layer_norm_epsilon = read_positive_number(j, "layer_norm_epsilon", c.layer_norm_epsilon, 1.0);
  // transformers' T5Config: "gated-gelu" -> gated, activation gelu_new; "relu" -> plain relu.
  const auto proj = j.get<std::string>("feed_forward_proj", "relu");
  const bool gated = proj.rfind("gated-", 0) == 0;
  c.is_gated = gated;
  c.dense_act_fn = gated ? proj.substr(6) : proj;
  if (c.dense_act_fn == "gelu") c.dense_act_fn = "gelu_new";  // T5Config's special case
  if (c.dense_act_fn != "gelu_new" && c.dense_act_fn != "relu" &&
      c.dense_act_fn != "gelu_pytorch_tanh")
    j.fail("feed_forward_proj",
           "unsupported '" + proj + "' (expected relu, gelu, gated-gelu or gated-relu)");
  for (auto [key, v] : {std::pair{"vocab_size", c.vocab_size},
                        {"d_model", c.d_model},
                        {"d_kv", c.d_kv},
                        {"d_ff", c.d_ff},
                        {"num_layers", c.num_layers},
                        {"num_heads", c.num_heads},
                        {"relative_attention_num_buckets", c.relative_attention_num_buckets},
                        {"relative_attention_max_distance", c.relative_attention_max_distance}})
    if (v <= 0) j.fail(key, "must be positive, got " + std::to_string(v));
  if (c.relative_attention_num_buckets < 4)
    j.fail("relative_attention_num_buckets",
           "must be at least 4, got " + std::to_string(c.relative_attention_num_buckets));
  return c;
}

T5LayerNormImpl::T5LayerNormImpl(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor T5LayerNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, true) + eps);
  return weight * h.to(weight.scalar_type());
}

namespace {

// transformers' T5Attention._relative_position_bucket, bidirectional (the encoder): half the
// buckets for each sign, exact buckets for small offsets, log-spaced up to max_distance.
torch::Tensor relative_position_bucket(const torch::Tensor& relative_position, int64_t num_buckets,
                                       int64_t max_distance) {
  num_buckets /= 2;
  auto buckets = (relative_position > 0).to(torch::kInt64) * num_buckets;
  auto rel = relative_position.abs();
  const int64_t max_exact = num_buckets / 2;
  auto is_small = rel < max_exact;
  auto if_large = max_exact + (torch::log(rel.to(torch::kFloat32) / max_exact) /
                               std::log(static_cast<double>(max_distance) / max_exact) *
                               (num_buckets - max_exact))
                                  .to(torch::kInt64);
  if_large = torch::minimum(if_large, torch::full_like(if_large, num_buckets - 1));
  return buckets + torch::where(is_small, rel, if_large);
}

// fp16 only: transformers clamps activations just below the float16 limit after each sub-layer.
torch::Tensor clamp_fp16(const torch::Tensor& x) {
  if (x.scalar_type() != torch::kHalf) return x;
  const double max = 65504.0;
  const double limit = torch::isinf(x).any().item<bool>() ? max - 1000 : max;
  return x.clamp(-limit, limit);
}

}  // namespace

T5AttentionImpl::T5AttentionImpl(const T5Config& c, bool has_relative_attention_bias) : config(c) {
  const int64_t inner = c.num_heads * c.d_kv;
  auto lin = [](int64_t in, int64_t out) {
    return nn::make_linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  q = register_module("q", lin(c.d_model, inner));
  k = register_module("k", lin(c.d_model, inner));
  v = register_module("v", lin(c.d_model, inner));
  o = register_module("o", lin(inner, c.d_model));
  if (has_relative_attention_bias)
    relative_attention_bias =
        register_module("relative_attention_bias",
                        nn::make_embedding(c.relative_attention_num_buckets, c.num_heads));
}

torch::Tensor T5AttentionImpl::compute_bias(int64_t nq, int64_t nk, const torch::Device& device) {
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(device);
  auto rel = torch::arange(nk, opts).unsqueeze(0) - torch::arange(nq, opts).unsqueeze(1);
  auto buckets = relative_position_bucket(rel, config.relative_attention_num_buckets,
                                          config.relative_attention_max_distance);
  return relative_attention_bias(buckets).permute({2, 0, 1}).unsqueeze(0);  // [1, H, Nq, Nk]
}

torch::Tensor T5AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& bias) {
  const auto B = x.size(0), N = x.size(1);
  auto split = [&](const torch::Tensor& t) {
    return t.view({B, N, config.num_heads, config.d_kv}).transpose(1, 2);
  };
  nn::AttentionOptions opts;
  opts.scale = 1.0;  // T5 folds the scaling into its weight initialisation
  opts.bias = bias;
  auto out = nn::attention(split(q(x)), split(k(x)), split(v(x)), opts);
  return o(out.transpose(1, 2).reshape({B, N, config.num_heads * config.d_kv}));
}

T5LayerSelfAttentionImpl::T5LayerSelfAttentionImpl(const T5Config& c,
                                                   bool has_relative_attention_bias) {
  SelfAttention = register_module("SelfAttention", T5Attention(c, has_relative_attention_bias));
  layer_norm = register_module("layer_norm", T5LayerNorm(c.d_model, c.layer_norm_epsilon));
}

T5DenseActDenseImpl::T5DenseActDenseImpl(const T5Config& c) : act(c.dense_act_fn) {
  auto lin = [](int64_t in, int64_t out) {
    return nn::make_linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  if (c.is_gated) {
    wi_0 = register_module("wi_0", lin(c.d_model, c.d_ff));
    wi_1 = register_module("wi_1", lin(c.d_model, c.d_ff));
  } else {
    wi = register_module("wi", lin(c.d_model, c.d_ff));
  }
  wo = register_module("wo", lin(c.d_ff, c.d_model));
}

torch::Tensor T5DenseActDenseImpl::forward(const torch::Tensor& x) {
  auto activate = [&](const torch::Tensor& h) {
    return act == "relu" ? torch::relu(h) : torch::gelu(h, "tanh");  // gelu_new = tanh form
  };
  auto h = wi_0 ? activate(wi_0(x)) * wi_1(x) : activate(wi(x));
  return wo(h.to(wo->weight.scalar_type()));
}

T5LayerFFImpl::T5LayerFFImpl(const T5Config& c) {
  DenseReluDense = register_module("DenseReluDense", T5DenseActDense(c));
  layer_norm = register_module("layer_norm", T5LayerNorm(c.d_model, c.layer_norm_epsilon));
}

T5BlockImpl::T5BlockImpl(const T5Config& c, bool has_relative_attention_bias) {
  layer = register_module("layer", torch::nn::ModuleList());
  layer->push_back(T5LayerSelfAttention(c, has_relative_attention_bias));
  layer->push_back(T5LayerFF(c));
}

torch::Tensor T5BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& bias) {
  auto attn = layer[0]->as<T5LayerSelfAttention>();
  auto h = clamp_fp16(x + attn->SelfAttention(attn->layer_norm(x), bias));
  auto ff = layer[1]->as<T5LayerFF>();
  return clamp_fp16(h + ff->DenseReluDense(ff->layer_norm(h)));
}

T5StackImpl::T5StackImpl(const T5Config& c) {
  block = register_module("block", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) block->push_back(T5Block(c, i == 0));
  final_layer_norm =
      register_module("final_layer_norm", T5LayerNorm(c.d_model, c.layer_norm_epsilon));
}

T5EncoderModelImpl::T5EncoderModelImpl(const T5Config& config) : config_(config) {
  shared = register_module("shared", nn::make_embedding(config.vocab_size, config.d_model));
  encoder = register_module("encoder", T5Stack(config));
}

T5EncoderOutput T5EncoderModelImpl::forward(const torch::Tensor& input_ids,
                                            const torch::Tensor& attention_mask,
                                            bool output_hidden_states) {
  if (input_ids.dim() != 2)
    throw InvalidArgument("T5 encoder: input_ids must be [batch, tokens], got " +
                          c10::str(input_ids.sizes()));
  const auto device = shared->weight.device();
  auto ids = input_ids.to(device, torch::kInt64);
  if (ids.numel() &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= config_.vocab_size))
    throw InvalidArgument("T5 encoder: token id outside [0, " + std::to_string(config_.vocab_size) +
                          ")");
  const auto N = ids.size(1);
  const auto dtype = shared->weight.scalar_type();

  auto first =
      encoder->block[0]->as<T5Block>()->layer[0]->as<T5LayerSelfAttention>()->SelfAttention;
  auto bias = first->compute_bias(N, N, device).to(dtype);  // [1, H, N, N]
  if (attention_mask.defined()) {
    if (attention_mask.sizes() != ids.sizes())
      throw InvalidArgument("T5 encoder: attention_mask " + c10::str(attention_mask.sizes()) +
                            " does not match input_ids " + c10::str(ids.sizes()));
    // transformers' extended mask: (1 - mask) * finfo(dtype).min on the keys.
    bias = bias + nn::key_padding_bias(attention_mask.to(device), dtype);
  }

  T5EncoderOutput out;
  auto h = shared(ids);
  if (output_hidden_states) out.hidden_states.push_back(h);
  for (const auto& block : *encoder->block) {
    h = block->as<T5Block>()->forward(h, bias);
    if (output_hidden_states) out.hidden_states.push_back(h);
  }
  out.last_hidden_state = encoder->final_layer_norm(h);
  if (output_hidden_states) out.hidden_states.back() = out.last_hidden_state;
  return out;
}

T5EncoderModel load_t5_encoder(const io::ModelFolder& folder, const std::string& component,
                               torch::Device device, torch::Dtype dtype) {
  auto config = T5Config::from_json(folder.component_config(component));
  T5EncoderModel model{nullptr};
  {
    nn::SkipInitGuard skip_init(dtype);  // every parameter is loaded below
    model = T5EncoderModel(config);
  }
  load_component_weights(*model, folder, component, {"encoder.embed_tokens.weight"});
  model->to(device, dtype);
  model->eval();
  return model;
}

}  // namespace diffuse::models
