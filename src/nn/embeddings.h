// Timestep embeddings (diffusers models/embeddings.py): the sinusoidal projection Timesteps
// (no weights) and the MLP TimestepEmbedding (linear_1, act, linear_2).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <optional>

#include "nn/activations.h"
#include "nn/layers.h"

namespace diffuse::nn {

// Sinusoidal embedding of 1-D `timesteps` (int or float, any device) -> [N, dim] float32,
// computed with the same float32 operations in the same order as diffusers'
// get_timestep_embedding, so integer and fractional timesteps match it bit for bit.
torch::Tensor get_timestep_embedding(const torch::Tensor& timesteps, int64_t dim,
                                     bool flip_sin_to_cos, double downscale_freq_shift,
                                     double scale = 1.0, double max_period = 10000.0);

struct TimestepsImpl : torch::nn::Module {
  TimestepsImpl(int64_t num_channels, bool flip_sin_to_cos, double downscale_freq_shift);
  torch::Tensor forward(const torch::Tensor& timesteps);

  int64_t num_channels;
  bool flip_sin_to_cos;
  double downscale_freq_shift;
};
TORCH_MODULE(Timesteps);

struct TimestepEmbeddingImpl : torch::nn::Module {
  TimestepEmbeddingImpl(int64_t in_channels, int64_t time_embed_dim, Activation act,
                        std::optional<Activation> post_act = std::nullopt);
  torch::Tensor forward(const torch::Tensor& sample);

  nn::Linear linear_1{nullptr}, linear_2{nullptr};
  Activation act;
  std::optional<Activation> post_act;
};
TORCH_MODULE(TimestepEmbedding);

}  // namespace diffuse::nn
