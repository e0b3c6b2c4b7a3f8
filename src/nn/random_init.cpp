#include "nn/random_init.h"

#include <torch/torch.h>

#include <cmath>
#include <random>

#include "io/string_affixes.h"
#include "nn/moe_feed_forward.h"

namespace diffuse::nn {
namespace {

using io::ends_with;

// Layers whose output is added to a residual stream.
double gain_for(const std::string& module_name) {
  for (const char* r : {"conv2", "to_out.0", "ff.net.2", "proj_out", "fc2", "out_proj", "to_out",
                        "to_out_t", ".w2"})
    if (ends_with(module_name, r)) return 0.5;
  if (ends_with(module_name, "decoder.conv_out")) return 0.6;
  return 1.0;
}

// Calls fill(parameter, mean, std) for every parameter the initialisation covers, in module
// order (the order fixes init_random_weights' random stream).
template <typename Fill>
void visit_parameters(torch::nn::Module& module, Fill fill) {
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const std::string& name = item.key();
    torch::nn::Module* m = item.value().get();
    if (auto* lin = dynamic_cast<torch::nn::LinearImpl*>(m)) {
      double fan_in = static_cast<double>(lin->weight.size(1));
      fill(lin->weight, 0, gain_for(name) / std::sqrt(fan_in));
      if (lin->bias.defined()) fill(lin->bias, 0, 0.05);
    } else if (auto* conv = dynamic_cast<torch::nn::Conv2dImpl*>(m)) {
      auto w = conv->weight;
      double fan_in = static_cast<double>(w.size(1) * w.size(2) * w.size(3));
      fill(w, 0, gain_for(name) / std::sqrt(fan_in));
      if (conv->bias.defined()) fill(conv->bias, 0, 0.05);
    } else if (auto* gn = dynamic_cast<torch::nn::GroupNormImpl*>(m)) {
      if (gn->weight.defined()) fill(gn->weight, 1, 0.2);
      if (gn->bias.defined()) fill(gn->bias, 0, 0.1);
    } else if (auto* ln = dynamic_cast<torch::nn::LayerNormImpl*>(m)) {
      if (ln->weight.defined()) fill(ln->weight, 1, 0.2);
      if (ln->bias.defined()) fill(ln->bias, 0, 0.1);
    } else if (auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(m)) {
      fill(emb->weight, 0, ends_with(name, "position_embedding") ? 0.5 : 1.0);
    } else if (auto* gate = dynamic_cast<MoEGateImpl*>(m)) {
      // A bias-free linear map to the expert logits. Left to its constructor, it would draw
      // from LibTorch's global generator, and the same seed would give other routings.
      fill(gate->weight, 0, 1.0 / std::sqrt(static_cast<double>(gate->weight.size(1))));
    }
  }
}

}  // namespace

void init_random_weights(torch::nn::Module& module, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  visit_parameters(module, [&](const torch::Tensor& p, double mean, double std) {
    auto v =
        torch::randn(p.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat32)) * std + mean;
    p.copy_(v);
  });
}

void init_pooled_random_weights(torch::nn::Module& module, uint64_t seed) {
  torch::NoGradGuard no_grad;
  constexpr int64_t kPool = int64_t{1} << 22;
  auto gen = at::detail::createCPUGenerator(seed);
  const auto pool = torch::randn({2 * kPool}, gen, torch::TensorOptions().dtype(torch::kFloat32));
  std::mt19937_64 offsets(seed);
  visit_parameters(module, [&](const torch::Tensor& p, double mean, double std) {
    auto flat = p.view({-1});
    for (int64_t begin = 0; begin < flat.numel(); begin += kPool) {
      const int64_t n = std::min(kPool, flat.numel() - begin);
      const int64_t start = static_cast<int64_t>(offsets() % static_cast<uint64_t>(kPool));
      flat.narrow(0, begin, n).copy_(pool.narrow(0, start, n) * std + mean);
    }
  });
}

}  // namespace diffuse::nn
