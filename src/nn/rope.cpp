#include "nn/rope.h"

#include <torch/torch.h>

#include "diffuse/errors.h"
#include "nn/npu_fused_ops.h"

namespace diffuse::nn {

RopeTable rope_table(const torch::Tensor& ids, const std::vector<int64_t>& axes_dims, double theta,
                     const torch::Device& device) {
  if (ids.dim() != 2 || ids.size(1) != static_cast<int64_t>(axes_dims.size()))
    throw InvalidArgument("rope_table: ids must be [tokens, " + std::to_string(axes_dims.size()) +
                          "], got " + c10::str(ids.sizes()));
  auto pos = ids.to(torch::kCPU, torch::kFloat64);
  std::vector<torch::Tensor> angles;
  for (size_t a = 0; a < axes_dims.size(); ++a) {
    const int64_t d = axes_dims[a];
    if (d <= 0 || d % 2 != 0)
      throw InvalidArgument("rope_table: axis " + std::to_string(a) + " has " + std::to_string(d) +
                            " dimensions; each axis needs a positive even number");
    auto scale = torch::arange(0, d, 2, torch::kFloat64) / static_cast<double>(d);
    auto omega = 1.0 / torch::pow(theta, scale);
    angles.push_back(pos.select(1, static_cast<int64_t>(a)).unsqueeze(1) * omega.unsqueeze(0));
  }
  auto angle = torch::cat(angles, 1);
  return {torch::cos(angle).to(device, torch::kFloat32),
          torch::sin(angle).to(device, torch::kFloat32)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const RopeTable& table) {
  const int64_t S = table.tokens(), R = table.cos.size(1);
  if (x.dim() != 4 || x.size(1) < S || x.size(3) < 2 * R)
    throw InvalidArgument("apply_rope: x must be [B, N >= " + std::to_string(S) +
                          ", H, D >= " + std::to_string(2 * R) + "], got " + c10::str(x.sizes()));
  const int64_t B = x.size(0), H = x.size(2);
  if (auto fused =
          npu_rotary_mul_interleaved(x.narrow(1, 0, S).narrow(3, 0, 2 * R), table.cos, table.sin)) {
    auto out = x.clone(torch::MemoryFormat::Contiguous);
    out.narrow(1, 0, S).narrow(3, 0, 2 * R).copy_(*fused);
    return out;
  }
  // [B, S, H, R, 2] pairs in float32; cos/sin broadcast over batch and heads.
  auto pairs = x.narrow(1, 0, S).narrow(3, 0, 2 * R).to(torch::kFloat32).reshape({B, S, H, R, 2});
  auto x0 = pairs.select(4, 0), x1 = pairs.select(4, 1);
  auto c = table.cos.view({1, S, 1, R}), s = table.sin.view({1, S, 1, R});
  // The same products and sum as diffusers' apply_rope (freqs[..., 0] * x0 + freqs[..., 1] * x1).
  auto y0 = c * x0 + (-s) * x1;
  auto y1 = s * x0 + c * x1;
  auto rotated = torch::stack({y0, y1}, -1).reshape({B, S, H, 2 * R}).to(x.scalar_type());
  // Every token and every channel rotated (HiDream, FLUX): nothing of x to keep.
  if (S == x.size(1) && 2 * R == x.size(3)) return rotated;
  auto out = x.clone(torch::MemoryFormat::Contiguous);
  out.narrow(1, 0, S).narrow(3, 0, 2 * R).copy_(rotated);
  return out;
}

torch::Tensor rope_table_as_matrices(const RopeTable& table, int64_t total_tokens) {
  const int64_t S = table.tokens(), R = table.cos.size(1);
  auto cos = torch::ones({total_tokens, R}, table.cos.options());
  auto sin = torch::zeros({total_tokens, R}, table.sin.options());
  cos.narrow(0, 0, S).copy_(table.cos);
  sin.narrow(0, 0, S).copy_(table.sin);
  return torch::stack({cos, -sin, sin, cos}, -1).view({1, total_tokens, 1, R, 2, 2});
}

}  // namespace diffuse::nn
