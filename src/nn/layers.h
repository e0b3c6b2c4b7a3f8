// Linear, Conv2d and Embedding layers for the models, built through these factories so that a
// model about to receive its weights can skip LibTorch's random initialisation: under a
// SkipInitGuard they allocate their weights uninitialised, directly in the guard's dtype
// (SD2's UNet: 865M parameters, ~4 s of kaiming_uniform_ on one core, and no float32 copy of
// a bf16 model). Without a guard they are ordinary, initialised LibTorch layers.
#pragma once
#include <c10/core/ScalarType.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

namespace diffuse::nn {

// While alive on this thread, the factories below leave weights and biases uninitialised in
// `dtype`. The caller must fill every parameter (load_state_dict checks that none is
// missing; init_random_weights covers every layer). Norm layers are unaffected (their
// initialisation is a cheap fill) and are converted by the model's ->to(dtype).
class SkipInitGuard {
 public:
  explicit SkipInitGuard(c10::ScalarType dtype);
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool saved_active_;
  c10::ScalarType saved_dtype_;
};

torch::nn::Linear make_linear(const torch::nn::LinearOptions& options);
inline torch::nn::Linear make_linear(int64_t in, int64_t out) {
  return make_linear(torch::nn::LinearOptions(in, out));
}
torch::nn::Conv2d make_conv2d(const torch::nn::Conv2dOptions& options);
torch::nn::Embedding make_embedding(int64_t num_embeddings, int64_t dim);

}  // namespace diffuse::nn
