// The `sdpa` backend: LibTorch's fused scaled_dot_product_attention (flash / memory-efficient
// kernels on CUDA, a fused kernel on CPU), which LibTorch has from 2.0 on. Against older
// LibTorch (Debian's 1.13) the backend compiles to "unavailable".
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <limits>

#include "diffuse/errors.h"
#include "nn/attention/backends.h"

namespace diffuse::nn {

#if TORCH_VERSION_MAJOR >= 2

std::string sdpa_unavailable(const torch::Device&) {
  return "";
}

torch::Tensor sdpa_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionCall& call) {
  const auto dtype = q.scalar_type();
  auto qq = q, kk = k, vv = v;
  if (call.upcast && dtype != torch::kFloat32) {
    qq = q.to(torch::kFloat32);
    kk = k.to(torch::kFloat32);
    vv = v.to(torch::kFloat32);
  }
  // torch refuses is_causal together with attn_mask: with a bias, the causal part joins it.
  c10::optional<torch::Tensor> mask;
  bool causal = call.causal;
  if (call.bias.defined()) {
    auto bias = call.bias.to(qq.scalar_type());
    if (causal) {
      auto upper = torch::ones({q.size(2), k.size(2)}, q.options().dtype(torch::kBool)).triu(1);
      bias = bias.masked_fill(upper, -std::numeric_limits<float>::infinity());
      causal = false;
    }
    mask = bias;
  }
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 1
  auto out = at::scaled_dot_product_attention(qq, kk, vv, mask, 0.0, causal, call.scale);
#else
  // 2.0 has no scale argument and uses 1/sqrt(D): fold the ratio into q.
  const double ratio = call.scale * std::sqrt(static_cast<double>(q.size(3)));
  if (ratio != 1.0) qq = qq * ratio;
  auto out = at::scaled_dot_product_attention(qq, kk, vv, mask, 0.0, causal);
#endif
  return out.to(dtype);
}

#else

std::string sdpa_unavailable(const torch::Device&) {
  return std::string("this libtorch (") + TORCH_VERSION +
         ") has no scaled_dot_product_attention; it needs libtorch >= 2.0";
}

torch::Tensor sdpa_attention(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                             const AttentionCall&) {
  throw InvalidArgument("attention backend 'sdpa' is not available: " +
                        sdpa_unavailable(torch::Device(torch::kCPU)));
}

#endif

}  // namespace diffuse::nn
