// CLIPTextModel and CLIPTextModelWithProjection (transformers) as the Stable Diffusion and
// HiDream pipelines use them: token + position
// embeddings, pre-LN transformer layers with a causal mask, final layer norm. Parameter names
// equal the transformers state-dict keys ("text_model.encoder.layers.0.self_attn.q_proj.weight",
// "text_projection.weight"). Position embeddings may be longer than 77 (HiDream's 248).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "io/json_config.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"

namespace diffuse::io {
class ModelFolder;
}

namespace diffuse::models {

struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";  // quick_gelu | gelu | gelu_new | gelu_pytorch_tanh
  int64_t eos_token_id = 2;
  // CLIPTextModelWithProjection: text_projection (no bias) maps the pooled state to
  // projection_dim. Set by the loader from the class name, not by from_json.
  bool with_projection = false;
  int64_t projection_dim = 512;

  static ClipTextConfig from_json(const io::JsonConfig& config);
};

struct ClipTextOutput {
  torch::Tensor last_hidden_state;           // after final_layer_norm: what SD feeds the UNet
  torch::Tensor pooler_output;               // last_hidden_state at the EOS token
  torch::Tensor text_embeds;                 // text_projection(pooler_output); with projection only
  std::vector<torch::Tensor> hidden_states;  // embeddings, then each layer (before final norm)
};

struct ClipMlpImpl : torch::nn::Module {
  ClipMlpImpl(const ClipTextConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  nn::Linear fc1{nullptr}, fc2{nullptr};
  std::string act;
};
TORCH_MODULE(ClipMlp);

struct ClipAttentionImpl : torch::nn::Module {
  ClipAttentionImpl(const ClipTextConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  int64_t heads;
};
TORCH_MODULE(ClipAttention);

struct ClipEncoderLayerImpl : torch::nn::Module {
  ClipEncoderLayerImpl(const ClipTextConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  ClipAttention self_attn{nullptr};
  nn::LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  ClipMlp mlp{nullptr};
};
TORCH_MODULE(ClipEncoderLayer);

struct ClipTextEmbeddingsImpl : torch::nn::Module {
  ClipTextEmbeddingsImpl(const ClipTextConfig& c);
  torch::Tensor forward(const torch::Tensor& input_ids);
  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};
};
TORCH_MODULE(ClipTextEmbeddings);

struct ClipEncoderImpl : torch::nn::Module {
  ClipEncoderImpl(const ClipTextConfig& c);
  torch::nn::ModuleList layers;
};
TORCH_MODULE(ClipEncoder);

struct ClipTextTransformerImpl : torch::nn::Module {
  ClipTextTransformerImpl(const ClipTextConfig& c);
  ClipTextEmbeddings embeddings{nullptr};
  ClipEncoder encoder{nullptr};
  nn::LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(ClipTextTransformer);

class ClipTextModelImpl : public torch::nn::Module {
 public:
  explicit ClipTextModelImpl(const ClipTextConfig& config);
  // input_ids: int64 [B, N] with N <= max_position_embeddings.
  ClipTextOutput forward(const torch::Tensor& input_ids, bool output_hidden_states = false);
  const ClipTextConfig& config() const { return config_; }

  ClipTextTransformer text_model{nullptr};
  nn::Linear text_projection{nullptr};  // CLIPTextModelWithProjection only

 private:
  ClipTextConfig config_;
};
TORCH_MODULE(ClipTextModel);

// <folder>/<component>/config.json as the model it builds (with_projection from the class).
ClipTextConfig clip_text_config(const io::ModelFolder& folder,
                                const std::string& component = "text_encoder");

// Builds from <folder>/<component> (config.json + weights) on `device` in `dtype`; a
// CLIPTextModelWithProjection (by model_index.json's class, else config.json's architectures)
// gets its text_projection.
ClipTextModel load_clip_text_model(const io::ModelFolder& folder, torch::Device device,
                                   torch::Dtype dtype,
                                   const std::string& component = "text_encoder");

}  // namespace diffuse::models
