#include "models/llama.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/config_values.h"
#include "models/load_component.h"
#include "nn/attention.h"
#include "nn/layers.h"

namespace diffuse::models {

LlamaConfig LlamaConfig::from_json(const io::JsonConfig& j) {
  LlamaConfig c;
  c.vocab_size = read_int_in(j, "vocab_size", c.vocab_size, 1, kMaxConfigVocab);
  c.hidden_size = read_int_in(j, "hidden_size", c.hidden_size, 1, kMaxConfigDim);
  c.intermediate_size = read_int_in(j, "intermediate_size", c.intermediate_size, 1, kMaxConfigDim);
  c.num_hidden_layers =
      read_int_in(j, "num_hidden_layers", c.num_hidden_layers, 1, kMaxConfigLayers);
  c.num_attention_heads =
      read_int_in(j, "num_attention_heads", c.num_attention_heads, 1, kMaxConfigDim);
  c.num_key_value_heads =
      read_int_in(j, "num_key_value_heads", c.num_attention_heads, 1, kMaxConfigDim);
  c.rms_norm_eps = read_positive_number(j, "rms_norm_eps", c.rms_norm_eps, 1.0);
  c.rope_theta = read_positive_number(j, "rope_theta", 10000.0, 1e12);
  c.attention_bias = j.get<bool>("attention_bias", false);
  c.o_proj_bias = c.attention_bias;
  c.mlp_bias = j.get<bool>("mlp_bias", false);
  for (auto [key, v] : {std::pair{"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"num_key_value_heads", c.num_key_value_heads}})
    if (v <= 0) j.fail(key, "must be positive, got " + std::to_string(v));
  if (!j.has("head_dim") && c.hidden_size % c.num_attention_heads != 0)
    j.fail("num_attention_heads", "hidden_size " + std::to_string(c.hidden_size) +
                                      " is not divisible by " +
                                      std::to_string(c.num_attention_heads) + " heads");
  c.head_dim = read_int_in(j, "head_dim", c.hidden_size / c.num_attention_heads, 1, kMaxConfigDim);
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    j.fail("head_dim",
           "must be positive and even (RoPE rotates pairs), got " + std::to_string(c.head_dim));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    j.fail("num_key_value_heads", std::to_string(c.num_key_value_heads) +
                                      " does not divide num_attention_heads " +
                                      std::to_string(c.num_attention_heads));
  if (j.get<std::string>("hidden_act", "silu") != "silu")
    j.fail("hidden_act",
           "unsupported '" + j.get<std::string>("hidden_act", "") + "' (expected silu)");
  if (!(c.rms_norm_eps > 0)) j.fail("rms_norm_eps", "must be positive");
  if (!(c.rope_theta > 0)) j.fail("rope_theta", "must be positive");
  if (j.has("rope_scaling")) {
    const auto& rs = j.json()["rope_scaling"];
    if (!rs.is_object()) j.fail("rope_scaling", "expected an object");
    const io::JsonConfig scaling(rs, j.source() + ": rope_scaling");
    c.rope_type =
        scaling.get<std::string>("rope_type", scaling.get<std::string>("type", "default"));
    if (c.rope_type == "llama3") {
      c.rope_factor = scaling.require<double>("factor");
      c.low_freq_factor = scaling.require<double>("low_freq_factor");
      c.high_freq_factor = scaling.require<double>("high_freq_factor");
      c.original_max_position_embeddings =
          scaling.require<double>("original_max_position_embeddings");
      if (!(c.high_freq_factor > c.low_freq_factor) || !(c.low_freq_factor > 0) ||
          !(c.rope_factor > 0))
        scaling.fail("high_freq_factor",
                     "expected factor > 0 and high_freq_factor > low_freq_factor > 0");
    } else if (c.rope_type != "default") {
      scaling.fail("rope_type", "unsupported '" + c.rope_type + "' (expected default or llama3)");
    }
  }
  return c;
}

torch::Tensor llama_inv_freq(const LlamaConfig& c) {
  // _compute_default_rope_parameters: computed in float32 as transformers does.
  auto exponents = torch::arange(0, c.head_dim, 2, torch::kInt64).to(torch::kFloat32) /
                   static_cast<double>(c.head_dim);
  auto inv_freq = 1.0 / torch::pow(torch::tensor(c.rope_theta, torch::kFloat32), exponents);
  if (c.rope_type != "llama3") return inv_freq;
  // _compute_llama3_parameters: long wavelengths divided by `factor`, short ones kept, a
  // smooth blend in between.
  const double low_freq_wavelen = c.original_max_position_embeddings / c.low_freq_factor;
  const double high_freq_wavelen = c.original_max_position_embeddings / c.high_freq_factor;
  auto wavelen = 2 * M_PI / inv_freq;
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / c.rope_factor, inv_freq);
  auto smooth = (c.original_max_position_embeddings / wavelen - c.low_freq_factor) /
                (c.high_freq_factor - c.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
  auto medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

LlamaRMSNormImpl::LlamaRMSNormImpl(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor LlamaRMSNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, true) + eps);
  return weight * h.to(x.scalar_type());
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c) : config(c) {
  auto lin = [&](int64_t in, int64_t out, bool bias) {
    return nn::make_linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  const bool b = c.attention_bias;
  q_proj = register_module("q_proj", lin(c.hidden_size, c.num_attention_heads * c.head_dim, b));
  k_proj = register_module("k_proj", lin(c.hidden_size, c.num_key_value_heads * c.head_dim, b));
  v_proj = register_module("v_proj", lin(c.hidden_size, c.num_key_value_heads * c.head_dim, b));
  o_proj = register_module("o_proj",
                           lin(c.num_attention_heads * c.head_dim, c.hidden_size, c.o_proj_bias));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                          const torch::Tensor& sin, const torch::Tensor& bias) {
  const auto B = x.size(0), N = x.size(1), D = config.head_dim;
  auto heads = [&](const torch::Tensor& t, int64_t h) {
    return t.view({B, N, h, D}).transpose(1, 2);
  };
  auto q = heads(q_proj(x), config.num_attention_heads);
  auto k = heads(k_proj(x), config.num_key_value_heads);
  auto v = heads(v_proj(x), config.num_key_value_heads);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  // Grouped-query attention: each key/value head serves num_attention_heads / kv heads queries.
  const auto groups = config.num_attention_heads / config.num_key_value_heads;
  if (groups > 1) {
    k = k.repeat_interleave(groups, 1);
    v = v.repeat_interleave(groups, 1);
  }
  nn::AttentionOptions opts;
  opts.causal = true;
  opts.bias = bias;  // padding mask; backends without bias support step aside (attention.h)
  auto out = nn::attention(q, k, v, opts);
  return o_proj(out.transpose(1, 2).reshape({B, N, config.num_attention_heads * D}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) {
  auto lin = [&](int64_t in, int64_t out) {
    return nn::make_linear(torch::nn::LinearOptions(in, out).bias(c.mlp_bias));
  };
  gate_proj = register_module("gate_proj", lin(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", lin(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", lin(c.intermediate_size, c.hidden_size));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c) {
  self_attn = register_module("self_attn", LlamaAttention(c));
  mlp = register_module("mlp", LlamaMLP(c));
  input_layernorm = register_module("input_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                             const torch::Tensor& sin, const torch::Tensor& bias) {
  auto h = x + self_attn(input_layernorm(x), cos, sin, bias);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) {
  embed_tokens = register_module("embed_tokens", nn::make_embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c));
  norm = register_module("norm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaEncoderOutput::stacked() const {
  if (hidden_states.size() < 2) throw InvalidArgument("Llama output has no layer states");
  return torch::stack(std::vector<torch::Tensor>(hidden_states.begin() + 1, hidden_states.end()),
                      0);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& config) : config_(config) {
  model = register_module("model", LlamaModel(config));
}

LlamaEncoderOutput LlamaForCausalLMImpl::forward(const torch::Tensor& input_ids,
                                                 const torch::Tensor& attention_mask) {
  if (input_ids.dim() != 2)
    throw InvalidArgument("Llama: input_ids must be [batch, tokens], got " +
                          c10::str(input_ids.sizes()));
  const auto device = model->embed_tokens->weight.device();
  const auto dtype = model->embed_tokens->weight.scalar_type();
  auto ids = input_ids.to(device, torch::kInt64);
  if (ids.numel() &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= config_.vocab_size))
    throw InvalidArgument("Llama: token id outside [0, " + std::to_string(config_.vocab_size) +
                          ")");
  const auto N = ids.size(1);
  torch::Tensor bias;
  if (attention_mask.defined()) {
    if (attention_mask.sizes() != ids.sizes())
      throw InvalidArgument("Llama: attention_mask " + c10::str(attention_mask.sizes()) +
                            " does not match input_ids " + c10::str(ids.sizes()));
    // Only needed where something is padded: without it every backend may run.
    if (!attention_mask.to(torch::kBool).all().item<bool>())
      bias = nn::key_padding_bias(attention_mask.to(device), dtype);
  }
  // cos/sin in float32 (transformers disables autocast for them), then the model's dtype.
  auto positions = torch::arange(N, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  auto freqs = torch::outer(positions, llama_inv_freq(config_).to(device));
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos().to(dtype), sin = emb.sin().to(dtype);

  LlamaEncoderOutput out;
  auto h = model->embed_tokens(ids);
  out.hidden_states.push_back(h);
  for (const auto& layer : *model->layers) {
    h = layer->as<LlamaDecoderLayer>()->forward(h, cos, sin, bias);
    out.hidden_states.push_back(h);
  }
  out.hidden_states.back() = model->norm(h);  // transformers appends the normed last state
  return out;
}

LlamaForCausalLM load_llama(const io::ModelFolder& folder, const std::string& component,
                            torch::Device device, torch::Dtype dtype) {
  auto config = LlamaConfig::from_json(folder.component_config(component));
  LlamaForCausalLM model{nullptr};
  {
    nn::SkipInitGuard skip_init(dtype);  // every parameter is loaded below
    model = LlamaForCausalLM(config);
  }
  load_component_weights(*model, folder, component, {"lm_head.weight"});
  model->to(device, dtype);
  model->eval();
  return model;
}

}  // namespace diffuse::models
