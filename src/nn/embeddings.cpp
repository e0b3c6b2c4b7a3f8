#include "nn/embeddings.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "diffuse/errors.h"
#include "nn/layers.h"
#include "nn/timestep_frequencies.h"

namespace diffuse::nn {

// exp(-log(max_period) * i / (half - shift)) for i < half, as float32: computed once per shape
// on the CPU, whose float32 exp diffusers' reference ran on, and copied to each device once. A
// device's own exp rounds some of these one ulp apart, and FLUX's guidance embedding multiplies
// them by guidance * 1000 (3500 and more), which turns one ulp into 4e-4 in the sines: fp32 FLUX
// on CUDA missed the golden transformer outputs by 2x their tolerance while CPU met them by 20x.
// The map is never destroyed: device tensors must not outlive their runtime at exit.
torch::Tensor timestep_frequencies(int64_t half, double downscale_freq_shift, double max_period,
                                   const torch::Device& device) {
  static std::mutex mutex;
  static auto* cache =
      new std::map<std::tuple<int64_t, double, double, std::string>, torch::Tensor>;
  const auto key = std::make_tuple(half, downscale_freq_shift, max_period, device.str());
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache->find(key); it != cache->end()) return it->second;
  // A normal tensor even when first asked for under InferenceMode: training uses it too.
  c10::InferenceMode normal_tensors(false);
  // Same op sequence as diffusers: float32 arange times a double scalar, divided by a scalar.
  auto exponent = torch::arange(0, half, torch::TensorOptions().dtype(torch::kFloat32)) *
                  (-std::log(max_period));
  exponent = exponent / (static_cast<double>(half) - downscale_freq_shift);
  auto freqs = torch::exp(exponent).to(device);
  cache->emplace(key, freqs);
  return freqs;
}

torch::Tensor get_timestep_embedding(const torch::Tensor& timesteps, int64_t dim,
                                     bool flip_sin_to_cos, double downscale_freq_shift,
                                     double scale, double max_period) {
  if (timesteps.dim() != 1)
    throw InvalidArgument("get_timestep_embedding: timesteps must be 1-D, got " +
                          std::to_string(timesteps.dim()) + "-D");
  int64_t half = dim / 2;
  const auto freqs =
      timestep_frequencies(half, downscale_freq_shift, max_period, timesteps.device());
  auto emb = timesteps.unsqueeze(1).to(torch::kFloat32) * freqs.unsqueeze(0);
  if (scale != 1.0) emb = emb * scale;  // diffusers multiplies by 1 too, which is exact
  emb = torch::cat({torch::sin(emb), torch::cos(emb)}, -1);
  if (flip_sin_to_cos) emb = torch::cat({emb.slice(1, half), emb.slice(1, 0, half)}, -1);
  if (dim % 2 == 1) emb = torch::constant_pad_nd(emb, {0, 1, 0, 0});
  return emb;
}

TimestepsImpl::TimestepsImpl(int64_t num_channels, bool flip_sin_to_cos,
                             double downscale_freq_shift)
    : num_channels(num_channels),
      flip_sin_to_cos(flip_sin_to_cos),
      downscale_freq_shift(downscale_freq_shift) {}

torch::Tensor TimestepsImpl::forward(const torch::Tensor& timesteps) {
  return get_timestep_embedding(timesteps, num_channels, flip_sin_to_cos, downscale_freq_shift);
}

TimestepEmbeddingImpl::TimestepEmbeddingImpl(int64_t in_channels, int64_t time_embed_dim,
                                             Activation act, std::optional<Activation> post_act)
    : act(act), post_act(post_act) {
  linear_1 = register_module("linear_1", nn::make_linear(in_channels, time_embed_dim));
  linear_2 = register_module("linear_2", nn::make_linear(time_embed_dim, time_embed_dim));
}

torch::Tensor TimestepEmbeddingImpl::forward(const torch::Tensor& sample) {
  auto x = linear_2(apply_activation(linear_1(sample), act));
  if (post_act) x = apply_activation(x, *post_act);
  return x;
}

}  // namespace diffuse::nn
