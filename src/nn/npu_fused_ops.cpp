#include "nn/npu_fused_ops.h"

#include <torch/torch.h>

#include <atomic>
#include <string>

#include "nn/attention.h"
#include "nn/npu_op_call.h"

namespace diffuse::nn {
namespace {

std::atomic<bool> g_rms_failed{false}, g_rotary_failed{false}, g_gmm_failed{false};

// Runs `call` unless the kernel failed before; on an exception disables it with one warning.
template <typename T, typename Call>
std::optional<T> guarded(std::atomic<bool>& failed, const char* name, Call&& call) {
  if (failed) return std::nullopt;
  try {
    return call();
  } catch (const std::exception& e) {
    failed = true;
    TORCH_WARN(name, " failed (", e.what(), "); diffuse uses its own implementation from now on");
    return std::nullopt;
  }
}

c10::IValue tensor_list(const std::vector<torch::Tensor>& ts) {
  c10::List<at::Tensor> list;
  for (const auto& t : ts) list.push_back(t);
  return list;
}

}  // namespace

bool npu_fused_ops_enabled(const torch::Tensor& x) {
  if (!x.defined() || x.device().type() != c10::DeviceType::PrivateUse1) return false;
  if (torch::GradMode::is_enabled() && x.requires_grad()) return false;
  const auto policy = default_attention_backend();
  return policy == AttentionBackend::kAuto || policy == AttentionBackend::kNpu;
}

std::optional<torch::Tensor> npu_rms_norm(const torch::Tensor& x, const torch::Tensor& gamma,
                                          double eps) {
  if (!gamma.defined() || !npu_fused_ops_enabled(x)) return std::nullopt;
  auto op = find_npu_op("npu::npu_rms_norm");
  if (!op) return std::nullopt;
  return guarded<torch::Tensor>(g_rms_failed, "npu_rms_norm", [&] {
    auto out = call_npu_op_by_name(
        *op, {{"self", x.contiguous()}, {"gamma", gamma.to(x.scalar_type())}, {"epsilon", eps}});
    return out.at(0).toTensor();  // (y, rstd)
  });
}

std::optional<torch::Tensor> npu_rotary_mul_interleaved(const torch::Tensor& x,
                                                        const torch::Tensor& cos,
                                                        const torch::Tensor& sin) {
  if (!npu_fused_ops_enabled(x)) return std::nullopt;
  auto op = find_npu_op("npu::npu_rotary_mul");
  if (!op || !schema_has_argument(*op, "rotary_mode")) return std::nullopt;
  return guarded<torch::Tensor>(g_rotary_failed, "npu_rotary_mul", [&] {
    const int64_t S = cos.size(0), R = cos.size(1);
    // [S, R] -> [1, S, 1, 2R] with each angle repeated for its pair (c0 c0 c1 c1 ...).
    auto expand = [&](const torch::Tensor& t) {
      return t.repeat_interleave(2, 1).view({1, S, 1, 2 * R}).to(x.device(), x.scalar_type());
    };
    auto out = call_npu_op_by_name(*op, {{"self", x.contiguous()},
                                         {"r1", expand(cos)},
                                         {"r2", expand(sin)},
                                         {"rotary_mode", std::string("interleave")}});
    return out.at(0).toTensor();
  });
}

std::optional<std::vector<torch::Tensor>> npu_grouped_matmul(const std::vector<torch::Tensor>& x,
                                                             const std::vector<torch::Tensor>& w) {
  if (x.empty() || x.size() != w.size() || !npu_fused_ops_enabled(x.front())) return std::nullopt;
  auto op = find_npu_op("npu::npu_grouped_matmul");
  if (!op) return std::nullopt;
  return guarded<std::vector<torch::Tensor>>(g_gmm_failed, "npu_grouped_matmul", [&] {
    std::vector<torch::Tensor> xs, ws;
    for (const auto& t : x) xs.push_back(t.contiguous());
    for (const auto& t : w) ws.push_back(t.contiguous());
    // One tensor per group in and out (split_item 0); newer releases also need group_type -1
    // (no grouping axis) passed explicitly.
    std::map<std::string, c10::IValue> args{
        {"x", tensor_list(xs)}, {"weight", tensor_list(ws)}, {"split_item", int64_t(0)}};
    if (schema_has_argument(*op, "group_type")) args["group_type"] = int64_t(-1);
    auto out = call_npu_op_by_name(*op, args);
    return out.at(0).toTensorList().vec();
  });
}

void reset_npu_fused_op_failures() {
  g_rms_failed = false;
  g_rotary_failed = false;
  g_gmm_failed = false;
}

}  // namespace diffuse::nn
