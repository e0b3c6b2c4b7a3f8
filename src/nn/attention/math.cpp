// The `math` backend: softmax(scale * q k^T) v with the scores materialised, as diffusers'
// AttnProcessor computes it (plus an optional additive bias, as T5 and transformers' eager
// attention add theirs). The reference every other backend is tested against.
#include <torch/torch.h>

#include <limits>

#include "nn/attention/backends.h"

namespace diffuse::nn {

torch::Tensor math_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionCall& call) {
  const auto B = q.size(0), H = q.size(1), Nq = q.size(2), D = q.size(3), Nk = k.size(2);
  const auto dtype = q.scalar_type();
  auto q3 = q.reshape({B * H, Nq, D});
  auto k3 = k.reshape({B * H, Nk, D});
  auto v3 = v.reshape({B * H, Nk, v.size(3)});
  if (call.upcast) {
    q3 = q3.to(torch::kFloat32);
    k3 = k3.to(torch::kFloat32);
  }
  // Not baddbmm(empty, q, k^T, beta=0, alpha=scale) as diffusers writes it: libtorch 1.13's
  // CPU kernel for small matrices reads the uninitialised input despite beta=0 and
  // intermittently yields NaN. bmm then an in-place scale rounds the same way.
  auto scores = torch::bmm(q3, k3.transpose(1, 2)).mul_(call.scale);
  if (call.causal) {
    auto mask = torch::ones({Nq, Nk}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
    scores.masked_fill_(mask.to(scores.device()), -std::numeric_limits<float>::infinity());
  }
  if (call.bias.defined())
    scores =
        (scores.view({B, H, Nq, Nk}) + call.bias.to(scores.scalar_type())).view({B * H, Nq, Nk});
  auto probs = scores.softmax(-1).to(v3.scalar_type());
  auto out = torch::bmm(probs, v3);
  return out.reshape({B, H, Nq, v.size(3)}).to(dtype);
}

}  // namespace diffuse::nn
