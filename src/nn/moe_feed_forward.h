// HiDream's feed-forward networks (diffusers transformer_hidream_image.py): the SwiGLU MLP and
// the mixture of experts built from it (DeepSeek-style: softmax gate, top-k routed experts
// WITHOUT renormalising the k weights, plus one always-on shared expert).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <vector>

#include "nn/layers.h"

namespace diffuse::nn {

// The SwiGLU hidden size for a requested `hidden_dim`: int(2 * hidden_dim / 3) rounded up to a
// multiple of `multiple_of` (HiDreamImageFeedForwardSwiGLU; multiple_of is 256 there).
int64_t swiglu_hidden_dim(int64_t hidden_dim, int64_t multiple_of = 256);

// w2(silu(w1 x) * w3 x), no biases.
struct FeedForwardSwiGLUImpl : torch::nn::Module {
  FeedForwardSwiGLUImpl(int64_t dim, int64_t hidden_dim);
  torch::Tensor forward(const torch::Tensor& x);

  nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(FeedForwardSwiGLU);

// Routing of n tokens: for each token its top-k experts and their (softmax) weights.
struct MoERouting {
  torch::Tensor experts;  // [n, k] int64
  torch::Tensor weights;  // [n, k], the gate's dtype
};

// The gate: logits = x W^T (no bias), softmax over the routed experts, top-k.
struct MoEGateImpl : torch::nn::Module {
  MoEGateImpl(int64_t dim, int64_t num_routed_experts, int64_t num_activated_experts);
  // x [n, dim] -> routing. The softmax runs in float32 for low-precision inputs.
  MoERouting forward(const torch::Tensor& x);

  torch::Tensor weight;  // [num_routed_experts, dim]
  int64_t top_k;
};
TORCH_MODULE(MoEGate);

// shared_experts (hidden 2*dim) + experts.i (hidden 4*dim each) + gate.
struct MOEFeedForwardSwiGLUImpl : torch::nn::Module {
  MOEFeedForwardSwiGLUImpl(int64_t dim, int64_t hidden_dim, int64_t num_routed_experts,
                           int64_t num_activated_experts);
  // x [..., dim]. Inference path: tokens are grouped by expert (one sort), each expert runs one
  // GEMM chain over its own tokens, and the weighted results are added into the output in
  // expert order (as diffusers' moe_infer); no per-token loop, no dense all-experts compute.
  torch::Tensor forward(const torch::Tensor& x);
  // Every expert on every token, combined with the routing weights: the definition the fast
  // path must match (tests only).
  torch::Tensor forward_dense_reference(const torch::Tensor& x);

  // Expert experts[i] on inputs[i], for each i: one grouped GEMM per layer on the npu
  // (npu_grouped_matmul), one GEMM chain per expert elsewhere.
  std::vector<torch::Tensor> run_experts(const std::vector<int64_t>& experts,
                                         const std::vector<torch::Tensor>& inputs);

  FeedForwardSwiGLU shared_experts{nullptr};
  torch::nn::ModuleList experts{nullptr};
  std::vector<FeedForwardSwiGLU> expert_list;
  MoEGate gate{nullptr};
};
TORCH_MODULE(MOEFeedForwardSwiGLU);

}  // namespace diffuse::nn
