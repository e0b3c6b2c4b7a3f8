#include "nn/random_init.h"

#include <torch/torch.h>

#include <cmath>

namespace diffuse::nn {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Layers whose output is added to a residual stream.
double gain_for(const std::string& module_name) {
  for (const char* r : {"conv2", "to_out.0", "ff.net.2", "proj_out", "fc2", "out_proj"})
    if (ends_with(module_name, r)) return 0.5;
  if (ends_with(module_name, "decoder.conv_out")) return 0.6;
  return 1.0;
}

}  // namespace

void init_random_weights(torch::nn::Module& module, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  auto normal_like = [&](const torch::Tensor& p, double mean, double std) {
    auto v = torch::randn(p.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat32)) * std + mean;
    p.copy_(v);
  };
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const std::string& name = item.key();
    torch::nn::Module* m = item.value().get();
    if (auto* lin = dynamic_cast<torch::nn::LinearImpl*>(m)) {
      double fan_in = static_cast<double>(lin->weight.size(1));
      normal_like(lin->weight, 0, gain_for(name) / std::sqrt(fan_in));
      if (lin->bias.defined()) normal_like(lin->bias, 0, 0.05);
    } else if (auto* conv = dynamic_cast<torch::nn::Conv2dImpl*>(m)) {
      auto w = conv->weight;
      double fan_in = static_cast<double>(w.size(1) * w.size(2) * w.size(3));
      normal_like(w, 0, gain_for(name) / std::sqrt(fan_in));
      if (conv->bias.defined()) normal_like(conv->bias, 0, 0.05);
    } else if (auto* gn = dynamic_cast<torch::nn::GroupNormImpl*>(m)) {
      if (gn->weight.defined()) normal_like(gn->weight, 1, 0.2);
      if (gn->bias.defined()) normal_like(gn->bias, 0, 0.1);
    } else if (auto* ln = dynamic_cast<torch::nn::LayerNormImpl*>(m)) {
      if (ln->weight.defined()) normal_like(ln->weight, 1, 0.2);
      if (ln->bias.defined()) normal_like(ln->bias, 0, 0.1);
    } else if (auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(m)) {
      normal_like(emb->weight, 0, ends_with(name, "position_embedding") ? 0.5 : 1.0);
    }
  }
}

}  // namespace diffuse::nn
