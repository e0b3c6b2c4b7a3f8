#include "models/clip_text_model.h"

#include <torch/torch.h>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/config_values.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/load_weights.h"

namespace diffuse::models {

ClipTextConfig ClipTextConfig::from_json(const io::JsonConfig& j) {
  ClipTextConfig c;
  c.vocab_size = read_int_in(j, "vocab_size", c.vocab_size, 1, kMaxConfigVocab);
  c.hidden_size = read_int_in(j, "hidden_size", c.hidden_size, 1, kMaxConfigDim);
  c.intermediate_size = read_int_in(j, "intermediate_size", c.intermediate_size, 1, kMaxConfigDim);
  c.num_hidden_layers =
      read_int_in(j, "num_hidden_layers", c.num_hidden_layers, 1, kMaxConfigLayers);
  c.num_attention_heads =
      read_int_in(j, "num_attention_heads", c.num_attention_heads, 1, kMaxConfigDim);
  c.max_position_embeddings =
      read_int_in(j, "max_position_embeddings", c.max_position_embeddings, 1, kMaxConfigPositions);
  c.layer_norm_eps = read_positive_number(j, "layer_norm_eps", c.layer_norm_eps, 1.0);
  c.hidden_act = j.get<std::string>("hidden_act", c.hidden_act);
  c.eos_token_id = read_int_in(j, "eos_token_id", c.eos_token_id, 0, c.vocab_size - 1);
  c.projection_dim = read_int_in(j, "projection_dim", c.projection_dim, 1, kMaxConfigDim);
  if (c.hidden_act != "quick_gelu" && c.hidden_act != "gelu" && c.hidden_act != "gelu_new" &&
      c.hidden_act != "gelu_pytorch_tanh")
    j.fail("hidden_act", "unsupported activation '" + c.hidden_act +
                             "' (expected quick_gelu, gelu, gelu_new or gelu_pytorch_tanh)");
  for (auto [key, v] : {std::pair{"hidden_size", c.hidden_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"intermediate_size", c.intermediate_size},
                        {"vocab_size", c.vocab_size},
                        {"max_position_embeddings", c.max_position_embeddings},
                        {"projection_dim", c.projection_dim}})
    if (v <= 0) j.fail(key, "must be positive, got " + std::to_string(v));
  if (c.hidden_size % c.num_attention_heads != 0)
    j.fail("num_attention_heads", "hidden_size " + std::to_string(c.hidden_size) +
                                      " is not divisible by " +
                                      std::to_string(c.num_attention_heads));
  return c;
}

ClipMlpImpl::ClipMlpImpl(const ClipTextConfig& c) : act(c.hidden_act) {
  fc1 = register_module("fc1", nn::make_linear(c.hidden_size, c.intermediate_size));
  fc2 = register_module("fc2", nn::make_linear(c.intermediate_size, c.hidden_size));
}

torch::Tensor ClipMlpImpl::forward(const torch::Tensor& x) {
  auto h = fc1(x);
  if (act == "quick_gelu") {
    h = h * torch::sigmoid(1.702 * h);
  } else if (act == "gelu") {
    h = torch::gelu(h);
  } else {
    h = torch::gelu(h, "tanh");
  }
  return fc2(h);
}

ClipAttentionImpl::ClipAttentionImpl(const ClipTextConfig& c) : heads(c.num_attention_heads) {
  q_proj = register_module("q_proj", nn::make_linear(c.hidden_size, c.hidden_size));
  k_proj = register_module("k_proj", nn::make_linear(c.hidden_size, c.hidden_size));
  v_proj = register_module("v_proj", nn::make_linear(c.hidden_size, c.hidden_size));
  out_proj = register_module("out_proj", nn::make_linear(c.hidden_size, c.hidden_size));
}

torch::Tensor ClipAttentionImpl::forward(const torch::Tensor& x) {
  auto B = x.size(0), N = x.size(1), C = x.size(2);
  auto split = [&](const torch::Tensor& t) {
    return t.view({B, N, heads, C / heads}).transpose(1, 2);
  };
  nn::AttentionOptions opts;
  opts.causal = true;
  auto o = nn::attention(split(q_proj(x)), split(k_proj(x)), split(v_proj(x)), opts);
  return out_proj(o.transpose(1, 2).reshape({B, N, C}));
}

ClipEncoderLayerImpl::ClipEncoderLayerImpl(const ClipTextConfig& c) {
  self_attn = register_module("self_attn", ClipAttention(c));
  auto ln = [&] {
    return nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps));
  };
  layer_norm1 = register_module("layer_norm1", ln());
  mlp = register_module("mlp", ClipMlp(c));
  layer_norm2 = register_module("layer_norm2", ln());
}

torch::Tensor ClipEncoderLayerImpl::forward(const torch::Tensor& x) {
  auto h = x + self_attn(layer_norm1(x));
  return h + mlp(layer_norm2(h));
}

ClipTextEmbeddingsImpl::ClipTextEmbeddingsImpl(const ClipTextConfig& c) {
  token_embedding =
      register_module("token_embedding", nn::make_embedding(c.vocab_size, c.hidden_size));
  position_embedding = register_module(
      "position_embedding", nn::make_embedding(c.max_position_embeddings, c.hidden_size));
}

torch::Tensor ClipTextEmbeddingsImpl::forward(const torch::Tensor& input_ids) {
  auto positions = torch::arange(input_ids.size(1), input_ids.options().dtype(torch::kInt64));
  return token_embedding(input_ids) + position_embedding(positions).unsqueeze(0);
}

ClipEncoderImpl::ClipEncoderImpl(const ClipTextConfig& c) {
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(ClipEncoderLayer(c));
}

ClipTextTransformerImpl::ClipTextTransformerImpl(const ClipTextConfig& c) {
  embeddings = register_module("embeddings", ClipTextEmbeddings(c));
  encoder = register_module("encoder", ClipEncoder(c));
  final_layer_norm = register_module(
      "final_layer_norm",
      nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps)));
}

ClipTextModelImpl::ClipTextModelImpl(const ClipTextConfig& config) : config_(config) {
  text_model = register_module("text_model", ClipTextTransformer(config));
  if (config.with_projection)
    text_projection = register_module(
        "text_projection",
        nn::make_linear(
            torch::nn::LinearOptions(config.hidden_size, config.projection_dim).bias(false)));
}

ClipTextOutput ClipTextModelImpl::forward(const torch::Tensor& input_ids,
                                          bool output_hidden_states) {
  if (input_ids.dim() != 2)
    throw InvalidArgument("text encoder: input_ids must be [batch, tokens], got " +
                          std::to_string(input_ids.dim()) + " dims");
  if (input_ids.size(1) > config_.max_position_embeddings)
    throw InvalidArgument("text encoder: " + std::to_string(input_ids.size(1)) +
                          " tokens exceed max_position_embeddings " +
                          std::to_string(config_.max_position_embeddings));
  auto ids = input_ids.to(text_model->embeddings->token_embedding->weight.device(), torch::kInt64);
  if (ids.numel() &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= config_.vocab_size))
    throw InvalidArgument("text encoder: token id outside [0, " +
                          std::to_string(config_.vocab_size) + ")");
  ClipTextOutput out;
  auto h = text_model->embeddings->forward(ids);
  if (output_hidden_states) out.hidden_states.push_back(h);
  for (const auto& layer : *text_model->encoder->layers) {
    h = layer->as<ClipEncoderLayer>()->forward(h);
    if (output_hidden_states) out.hidden_states.push_back(h);
  }
  out.last_hidden_state = text_model->final_layer_norm(h);
  // transformers' rule: old configs (eos_token_id == 2) take the highest id as EOS position.
  auto eos_pos = config_.eos_token_id == 2
                     ? ids.argmax(-1)
                     : ids.eq(config_.eos_token_id).to(torch::kInt32).argmax(-1);
  out.pooler_output =
      out.last_hidden_state.index({torch::arange(ids.size(0), ids.options()), eos_pos});
  if (text_projection) out.text_embeds = text_projection(out.pooler_output);
  return out;
}

ClipTextConfig clip_text_config(const io::ModelFolder& folder, const std::string& component) {
  const auto json = folder.component_config(component);
  auto config = ClipTextConfig::from_json(json);
  std::string cls = folder.component_class(component);
  if (cls.empty() && json.has("architectures") && json.json()["architectures"].is_array() &&
      !json.json()["architectures"].empty() && json.json()["architectures"][0].is_string())
    cls = json.json()["architectures"][0].get<std::string>();
  config.with_projection = cls == "CLIPTextModelWithProjection";
  return config;
}

ClipTextModel load_clip_text_model(const io::ModelFolder& folder, torch::Device device,
                                   torch::Dtype dtype, const std::string& component) {
  const auto config = clip_text_config(folder, component);
  ClipTextModel model{nullptr};
  {
    nn::SkipInitGuard skip_init(dtype);  // every parameter is loaded below
    model = ClipTextModel(config);
  }
  auto weights = folder.component_weights(component);
  nn::load_state_dict(*model, weights, folder.component_dir(component),
                      {"text_model.embeddings.position_ids"});
  model->to(device, dtype);
  model->eval();
  return model;
}

}  // namespace diffuse::models
