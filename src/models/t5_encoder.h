// T5EncoderModel (transformers), the T5 v1.1 encoder HiDream and SD3/Flux condition on:
// shared token embedding, pre-norm blocks of self-attention (no 1/sqrt(d) scaling, a learned
// relative position bias from block 0 shared by every block) and a gated-GELU feed-forward,
// RMS-style T5LayerNorm, final_layer_norm. Parameter names equal the transformers state-dict
// keys ("encoder.block.0.layer.0.SelfAttention.q.weight"), so hub weights load by name.
//
// Dtype: T5-XXL's activations overflow float16 (the feed-forward output grows past 65504 in
// the later blocks; transformers clamps and still degrades), so callers keep T5 in bfloat16
// or float32 (the pipelines' dtype policy); float16 is accepted but not recommended.
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

struct T5Config {
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  // feed_forward_proj "gated-gelu" (v1.1: wi_0, wi_1) or "relu"/"gelu" (v1.0: wi); dense_act_fn
  // is the activation ("gelu_new" = tanh approximation, "gelu", "relu").
  bool is_gated = true;
  std::string dense_act_fn = "gelu_new";

  static T5Config from_json(const io::JsonConfig& config);
};

// T5LayerNorm: weight * x / sqrt(mean(x^2) + eps), no mean subtraction, no bias; statistics
// in float32.
struct T5LayerNormImpl : torch::nn::Module {
  T5LayerNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(T5LayerNorm);

struct T5AttentionImpl : torch::nn::Module {
  T5AttentionImpl(const T5Config& c, bool has_relative_attention_bias);
  // bias: [1 or B, H, N, N] additive (position bias + mask).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& bias);
  // relative_attention_bias of the bucketed (key - query) offsets: [1, H, Nq, Nk].
  torch::Tensor compute_bias(int64_t nq, int64_t nk, const torch::Device& device);
  nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  torch::nn::Embedding relative_attention_bias{nullptr};
  T5Config config;
};
TORCH_MODULE(T5Attention);

struct T5LayerSelfAttentionImpl : torch::nn::Module {
  explicit T5LayerSelfAttentionImpl(const T5Config& c, bool has_relative_attention_bias);
  T5Attention SelfAttention{nullptr};
  T5LayerNorm layer_norm{nullptr};
};
TORCH_MODULE(T5LayerSelfAttention);

struct T5DenseActDenseImpl : torch::nn::Module {
  explicit T5DenseActDenseImpl(const T5Config& c);
  torch::Tensor forward(const torch::Tensor& x);
  nn::Linear wi{nullptr}, wi_0{nullptr}, wi_1{nullptr}, wo{nullptr};
  std::string act;
};
TORCH_MODULE(T5DenseActDense);

struct T5LayerFFImpl : torch::nn::Module {
  explicit T5LayerFFImpl(const T5Config& c);
  T5DenseActDense DenseReluDense{nullptr};
  T5LayerNorm layer_norm{nullptr};
};
TORCH_MODULE(T5LayerFF);

struct T5BlockImpl : torch::nn::Module {
  T5BlockImpl(const T5Config& c, bool has_relative_attention_bias);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& bias);
  torch::nn::ModuleList layer;  // [T5LayerSelfAttention, T5LayerFF]
};
TORCH_MODULE(T5Block);

struct T5StackImpl : torch::nn::Module {
  explicit T5StackImpl(const T5Config& c);
  torch::nn::ModuleList block;
  T5LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(T5Stack);

struct T5EncoderOutput {
  torch::Tensor last_hidden_state;           // after final_layer_norm
  std::vector<torch::Tensor> hidden_states;  // embeddings, each block, then last_hidden_state
};

class T5EncoderModelImpl : public torch::nn::Module {
 public:
  explicit T5EncoderModelImpl(const T5Config& config);
  // input_ids int64 [B, N]; attention_mask [B, N] (1 = token, 0 = padding) or undefined.
  T5EncoderOutput forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                          bool output_hidden_states = false);
  const T5Config& config() const { return config_; }

  torch::nn::Embedding shared{nullptr};  // encoder.embed_tokens is the same (tied) table
  T5Stack encoder{nullptr};

 private:
  T5Config config_;
};
TORCH_MODULE(T5EncoderModel);

// Builds from <folder>/<component> (config.json + weights, sharded or not) on `device` in
// `dtype`. A stored "encoder.embed_tokens.weight" (the tied alias of shared.weight) is accepted.
T5EncoderModel load_t5_encoder(const io::ModelFolder& folder, const std::string& component,
                               torch::Device device, torch::Dtype dtype);

}  // namespace diffuse::models
