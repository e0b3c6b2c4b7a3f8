// LlamaForCausalLM (transformers) used as a text encoder, as HiDream takes Llama-3.1-8B-Instruct:
// token embedding, decoder layers (RMSNorm, grouped-query attention with RoPE incl. Llama-3.1's
// "llama3" frequency scaling, SwiGLU MLP), final norm, and the hidden state of every layer.
// The language-model head is neither built nor loaded (HiDream never uses the logits; at full
// size it is 1 GB). Parameter names equal the transformers keys
// ("model.layers.0.self_attn.q_proj.weight").
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "io/json_config.h"
#include "nn/layers.h"

namespace diffuse::io {
class ModelFolder;
}

namespace diffuse::models {

struct LlamaConfig {
  int64_t vocab_size = 128256;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 14336;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 128;  // default hidden_size / num_attention_heads
  double rms_norm_eps = 1e-5;
  double rope_theta = 500000.0;
  bool attention_bias = false;  // q/k/v projections (and o_proj, unless o_proj_bias says not)
  bool o_proj_bias = false;     // from_json: = attention_bias; Qwen2 has q/k/v biases only
  bool mlp_bias = false;
  // rope_scaling: "default" (none) or "llama3" with its four values.
  std::string rope_type = "default";
  double rope_factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;

  // ConfigError naming file and key for unsupported values (hidden_act other than silu, a
  // rope_type other than default/llama3, heads that do not divide hidden_size, ...).
  static LlamaConfig from_json(const io::JsonConfig& config);
};

// LlamaRMSNorm: weight * (x / sqrt(mean(x^2) + eps)), statistics in float32.
struct LlamaRMSNormImpl : torch::nn::Module {
  LlamaRMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(LlamaRMSNorm);

struct LlamaAttentionImpl : torch::nn::Module {
  explicit LlamaAttentionImpl(const LlamaConfig& c);
  // cos/sin [N, head_dim] (or [B, 1, N, head_dim]: per-sequence positions, Qwen2-VL's mRoPE);
  // bias: additive key mask [B, 1, 1, N] or undefined.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& bias);
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  LlamaConfig config;
};
TORCH_MODULE(LlamaAttention);

struct LlamaMLPImpl : torch::nn::Module {
  explicit LlamaMLPImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

struct LlamaDecoderLayerImpl : torch::nn::Module {
  explicit LlamaDecoderLayerImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& bias);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

struct LlamaModelImpl : torch::nn::Module {
  explicit LlamaModelImpl(const LlamaConfig& c);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers;
  LlamaRMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

struct LlamaEncoderOutput {
  // transformers' hidden_states: [embeddings, layer 0, ..., layer n-2, norm(layer n-1)].
  std::vector<torch::Tensor> hidden_states;
  // What HiDream takes: hidden_states[1:] stacked, [num_hidden_layers, B, N, hidden].
  torch::Tensor stacked() const;
};

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(const LlamaConfig& config);
  // input_ids int64 [B, N]; attention_mask [B, N] (1 = token, 0 = padding) or undefined.
  // Attention is causal; padded keys are masked (transformers' eager/sdpa masking), padded
  // positions are computed normally.
  LlamaEncoderOutput forward(const torch::Tensor& input_ids,
                             const torch::Tensor& attention_mask = {});
  const LlamaConfig& config() const { return config_; }

  LlamaModel model{nullptr};

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaForCausalLM);

// (x1, x2) -> (-x2, x1) over the halves of the last dimension: the rotation of half-split
// rotary embeddings (Llama, Qwen2 and Qwen2.5-VL's vision tower).
torch::Tensor rotate_half(const torch::Tensor& x);

// RoPE inverse frequencies [head_dim / 2] (float32), with the config's rope scaling.
torch::Tensor llama_inv_freq(const LlamaConfig& config);

// Builds from <folder>/<component> on `device` in `dtype`; "lm_head.weight" in the file is
// skipped, never read.
LlamaForCausalLM load_llama(const io::ModelFolder& folder, const std::string& component,
                            torch::Device device, torch::Dtype dtype);

}  // namespace diffuse::models
