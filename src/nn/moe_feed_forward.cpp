#include "nn/moe_feed_forward.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "nn/layers.h"
#include "nn/npu_fused_ops.h"

namespace diffuse::nn {

int64_t swiglu_hidden_dim(int64_t hidden_dim, int64_t multiple_of) {
  const int64_t h = static_cast<int64_t>(2.0 * static_cast<double>(hidden_dim) / 3.0);
  return multiple_of * ((h + multiple_of - 1) / multiple_of);
}

FeedForwardSwiGLUImpl::FeedForwardSwiGLUImpl(int64_t dim, int64_t hidden_dim) {
  const int64_t hidden = swiglu_hidden_dim(hidden_dim);
  auto no_bias = [](int64_t in, int64_t out) {
    return make_linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  w1 = register_module("w1", no_bias(dim, hidden));
  w2 = register_module("w2", no_bias(hidden, dim));
  w3 = register_module("w3", no_bias(dim, hidden));
}

torch::Tensor FeedForwardSwiGLUImpl::forward(const torch::Tensor& x) {
  auto h = torch::silu(w1(x));
  // In place saves a buffer at inference; autograd (the demo trainer) needs h intact.
  if (torch::GradMode::is_enabled())
    h = h * w3(x);
  else
    h.mul_(w3(x));
  return w2(h);
}

MoEGateImpl::MoEGateImpl(int64_t dim, int64_t num_routed_experts, int64_t num_activated_experts)
    : top_k(num_activated_experts) {
  weight = register_parameter("weight", torch::empty({num_routed_experts, dim}));
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
}

MoERouting MoEGateImpl::forward(const torch::Tensor& x) {
  auto logits = torch::nn::functional::linear(x, weight);
  auto scores = logits.to(torch::kFloat32).softmax(-1);
  auto top = torch::topk(scores, top_k, -1, /*largest=*/true, /*sorted=*/false);
  return {std::get<1>(top), std::get<0>(top).to(x.scalar_type())};
}

MOEFeedForwardSwiGLUImpl::MOEFeedForwardSwiGLUImpl(int64_t dim, int64_t hidden_dim,
                                                   int64_t num_routed_experts,
                                                   int64_t num_activated_experts) {
  shared_experts = register_module("shared_experts", FeedForwardSwiGLU(dim, hidden_dim / 2));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t i = 0; i < num_routed_experts; ++i) {
    expert_list.emplace_back(dim, hidden_dim);
    experts->push_back(expert_list.back());
  }
  gate = register_module("gate", MoEGate(dim, num_routed_experts, num_activated_experts));
}

std::vector<torch::Tensor> MOEFeedForwardSwiGLUImpl::run_experts(
    const std::vector<int64_t>& experts, const std::vector<torch::Tensor>& inputs) {
  // The grouped kernel reads the plain weights only: experts with run-time LoRA updates
  // attached (unmerged adapters) or quantized weights take the per-expert path.
  bool low_rank = false;
  for (auto e : experts)
    for (auto* l : {&expert_list[e]->w1, &expert_list[e]->w2, &expert_list[e]->w3})
      low_rank = low_rank || !(*l)->low_rank.empty() || (*l)->quantized;
  if (!inputs.empty() && !low_rank && npu_fused_ops_enabled(inputs.front())) {
    // Each GEMM of the SwiGLU chain as one grouped call over the experts (weights as [K, N]).
    auto grouped = [&](nn::Linear FeedForwardSwiGLUImpl::*layer,
                       const std::vector<torch::Tensor>& xs) {
      std::vector<torch::Tensor> ws;
      for (auto e : experts) ws.push_back(((*expert_list[e]).*layer)->weight.t());
      return npu_grouped_matmul(xs, ws);
    };
    auto h1 = grouped(&FeedForwardSwiGLUImpl::w1, inputs);
    auto h3 = h1 ? grouped(&FeedForwardSwiGLUImpl::w3, inputs) : std::nullopt;
    if (h1 && h3) {
      std::vector<torch::Tensor> hidden;
      for (size_t i = 0; i < h1->size(); ++i)
        hidden.push_back(torch::silu((*h1)[i]).mul_((*h3)[i]));
      if (auto y = grouped(&FeedForwardSwiGLUImpl::w2, hidden)) return *y;
    }
  }
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < inputs.size(); ++i) out.push_back(expert_list[experts[i]](inputs[i]));
  return out;
}

torch::Tensor MOEFeedForwardSwiGLUImpl::forward(const torch::Tensor& x_in) {
  const int64_t dim = x_in.size(-1);
  auto x = x_in.reshape({-1, dim});
  const auto routing = gate(x);
  const int64_t k = routing.experts.size(1);
  // Sort the n*k (token, expert) assignments by expert; a stable sort keeps tokens in order
  // within an expert, as diffusers' argsort over a small integer range does in practice.
  auto flat_experts = routing.experts.reshape({-1});
  auto order = std::get<1>(flat_experts.sort(/*stable=*/true, 0, false));
  auto counts = torch::bincount(flat_experts, {}, static_cast<int64_t>(expert_list.size()))
                    .to(torch::kCPU)
                    .contiguous();
  auto flat_weights = routing.weights.reshape({-1, 1});
  auto tokens = torch::div(order, k, "floor");
  const int64_t* count = counts.data_ptr<int64_t>();
  std::vector<int64_t> used;
  std::vector<torch::Tensor> rows, inputs, weights;
  int64_t start = 0;
  for (size_t e = 0; e < expert_list.size(); ++e) {
    const int64_t n = count[e];
    if (n == 0) continue;
    used.push_back(static_cast<int64_t>(e));
    rows.push_back(tokens.narrow(0, start, n));
    inputs.push_back(x.index_select(0, rows.back()));
    weights.push_back(flat_weights.index_select(0, order.narrow(0, start, n)));
    start += n;
  }
  auto outputs = run_experts(used, inputs);
  auto out = torch::zeros_like(x);
  for (size_t i = 0; i < outputs.size(); ++i)
    out.index_add_(
        0, rows[i],
        torch::GradMode::is_enabled() ? outputs[i] * weights[i] : outputs[i].mul_(weights[i]));
  out.add_(shared_experts(x));
  return out.view(x_in.sizes());
}

torch::Tensor MOEFeedForwardSwiGLUImpl::forward_dense_reference(const torch::Tensor& x_in) {
  const int64_t dim = x_in.size(-1);
  auto x = x_in.reshape({-1, dim});
  const auto routing = gate(x);
  auto out = torch::zeros_like(x);
  for (size_t e = 0; e < expert_list.size(); ++e) {
    // Weight of expert e per token: its routing weight where selected, 0 elsewhere.
    auto w = (routing.weights * routing.experts.eq(static_cast<int64_t>(e)).to(x.scalar_type()))
                 .sum(1, /*keepdim=*/true);
    out = out + expert_list[e](x) * w;
  }
  return (out + shared_experts(x)).view(x_in.sizes());
}

}  // namespace diffuse::nn
