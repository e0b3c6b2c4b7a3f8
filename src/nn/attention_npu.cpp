#include "nn/attention_npu.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <string>

#include "device/npu_backend.h"

#include "nn/attention/backends.h"
#include "nn/npu_op_call.h"

namespace diffuse::nn {
namespace {

constexpr int64_t kAllTokens = 2147483647;  // torch_npu's "no sparsity window" value

std::atomic<bool> g_fusion_failed{false};
std::atomic<bool> g_pfa_failed{false};

const char* schema_name(NpuAttentionKernel kernel) {
  return kernel == NpuAttentionKernel::kFusionAttention ? "npu::npu_fusion_attention"
                                                        : "npu::npu_prompt_flash_attention";
}

c10::optional<c10::OperatorHandle> find_op(NpuAttentionKernel kernel) {
  return find_npu_op(schema_name(kernel));
}

torch::Tensor causal_mask(int64_t nq, int64_t nk, const torch::Device& device) {
  // torch_npu's polarity: true = masked out (does not take part), the upper triangle.
  return torch::ones({nq, nk}, torch::TensorOptions().dtype(torch::kBool)).triu(1).to(device);
}

torch::Tensor run_fusion(const c10::OperatorHandle& op, const torch::Tensor& q,
                         const torch::Tensor& k, const torch::Tensor& v, double scale,
                         bool causal) {
  std::map<std::string, c10::IValue> a{
      {"query", q.contiguous()},
      {"key", k.contiguous()},
      {"value", v.contiguous()},
      {"head_num", q.size(1)},
      {"input_layout", std::string("BNSD")},
      {"scale", scale},
      {"keep_prob", 1.0},
      {"pre_tockens", kAllTokens},
      {"next_tockens", causal ? int64_t(0) : kAllTokens},
      {"sparse_mode", int64_t(0)},
  };
  if (causal) a["atten_mask"] = causal_mask(q.size(2), k.size(2), q.device());
  // Outputs: attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, mask length.
  return call_npu_op_by_name(op, a).at(0).toTensor();
}

torch::Tensor run_prompt_flash(const c10::OperatorHandle& op, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, double scale,
                               bool causal) {
  // next_tokens defaults to 0 (causal) in this operator: widen both windows for full attention.
  std::map<std::string, c10::IValue> a{
      {"query", q.contiguous()},
      {"key", k.contiguous()},
      {"value", v.contiguous()},
      {"num_heads", q.size(1)},
      {"scale_value", scale},
      {"pre_tokens", kAllTokens},
      {"next_tokens", causal ? int64_t(0) : kAllTokens},
      {"input_layout", std::string("BNSD")},
  };
  if (causal) a["atten_mask"] = causal_mask(q.size(2), k.size(2), q.device());
  return call_npu_op_by_name(op, a).at(0).toTensor();
}

}  // namespace

const char* npu_attention_kernel_name(NpuAttentionKernel kernel) {
  switch (kernel) {
    case NpuAttentionKernel::kNone:
      return "none";
    case NpuAttentionKernel::kFusionAttention:
      return "npu_fusion_attention";
    case NpuAttentionKernel::kPromptFlashAttention:
      return "npu_prompt_flash_attention";
  }
  return "?";
}

std::string npu_attention_unavailable(const torch::Device& device) {
  if (device.type() != c10::DeviceType::PrivateUse1)
    return "fused npu attention runs on the npu device only";
  if (!device::npu_backend()) return "this build has no npu device (-DDIFFUSE_WITH_TORCH_NPU=OFF)";
  if (!find_op(NpuAttentionKernel::kFusionAttention) &&
      !find_op(NpuAttentionKernel::kPromptFlashAttention))
    return "torch_npu registers neither npu_fusion_attention nor npu_prompt_flash_attention";
  return "";
}

std::string npu_attention_unsupported(const torch::Tensor& q) {
  if (select_npu_attention_kernel(q) != NpuAttentionKernel::kNone) return "";
  return "no fused npu kernel takes " + std::string(c10::toString(q.scalar_type())) +
         " inputs with " + std::to_string(q.size(1)) + " heads of size " +
         std::to_string(q.size(3)) + " on this device (or the kernel failed earlier)";
}

NpuAttentionKernel select_npu_attention_kernel(const torch::Tensor& q) {
  if (!q.defined() || q.dim() != 4 || q.device().type() != c10::DeviceType::PrivateUse1)
    return NpuAttentionKernel::kNone;
  const device::NpuBackend* b = device::npu_backend();
  if (!b || !b->capabilities) return NpuAttentionKernel::kNone;
  device::NpuCapabilities caps = b->capabilities(q.device().has_index() ? q.device().index() : 0);
  auto dtype = q.scalar_type();
  int64_t heads = q.size(1), head_dim = q.size(3);
  // Limits from the operators' documentation: heads <= 256; head_dim <= 768 (fusion) / 512.
  if (caps.fusion_attention && !g_fusion_failed && heads <= 256 && head_dim <= 768 &&
      (dtype == torch::kFloat16 || dtype == torch::kBFloat16 || dtype == torch::kFloat32) &&
      find_op(NpuAttentionKernel::kFusionAttention))
    return NpuAttentionKernel::kFusionAttention;
  if (caps.prompt_flash_attention && !g_pfa_failed && heads <= 256 && head_dim <= 512 &&
      (dtype == torch::kFloat16 ||
       (dtype == torch::kBFloat16 && caps.prompt_flash_attention_bf16)) &&
      find_op(NpuAttentionKernel::kPromptFlashAttention))
    return NpuAttentionKernel::kPromptFlashAttention;
  return NpuAttentionKernel::kNone;
}

torch::Tensor npu_fused_attention(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, double scale, bool causal) {
  NpuAttentionKernel kernel = select_npu_attention_kernel(q);
  if (kernel == NpuAttentionKernel::kNone) {
    AttentionOptions math;
    math.scale = scale;
    math.causal = causal;
    math.backend = AttentionBackend::kMath;
    return attention(q, k, v, math);
  }
  auto op = find_op(kernel);
  try {
    return kernel == NpuAttentionKernel::kFusionAttention
               ? run_fusion(*op, q, k, v, scale, causal)
               : run_prompt_flash(*op, q, k, v, scale, causal);
  } catch (const std::exception& e) {
    (kernel == NpuAttentionKernel::kFusionAttention ? g_fusion_failed : g_pfa_failed) = true;
    TORCH_WARN(npu_attention_kernel_name(kernel), " failed (", e.what(),
               "); npu attention uses the next kernel or the math path from now on");
    return npu_fused_attention(q, k, v, scale, causal);
  }
}

void reset_npu_attention_failures() {
  g_fusion_failed = false;
  g_pfa_failed = false;
}

void register_npu_attention_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    AttentionBackendHooks hooks;
    hooks.run = [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const AttentionCall& c) {
      return npu_fused_attention(q, k, v, c.scale, c.causal);
    };
    hooks.unsupported = [](const torch::Tensor& q, const torch::Tensor&, const torch::Tensor&,
                           const AttentionCall&) { return npu_attention_unsupported(q); };
    hooks.unavailable = npu_attention_unavailable;
    register_attention_backend(AttentionBackend::kNpu, hooks);
  });
}

}  // namespace diffuse::nn
