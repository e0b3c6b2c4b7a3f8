// torch_npu's fused operators for the pieces of HiDream's transformer, called through the
// dispatcher by schema (nn/npu_op_call.h), each with the engine's own implementation as the
// fallback:
//   npu::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
//   npu::npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor
//   npu::npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, ..., int? split_item=0,
//                           int? group_type=None, ...) -> Tensor[]
// (schemas as in Ascend/op-plugin's op_plugin_functions.yaml; npu_rotary_mul gained
// rotary_mode, and npu_grouped_matmul group_type, in later releases: a build whose schema
// lacks what we pass falls back.) They run behind the switch of the fused attention: on the
// npu device when the attention policy is auto or npu (`--attention math` turns all fused npu
// kernels off). A kernel that throws is disabled for the process with one warning.
#pragma once
#include <torch/types.h>

#include <optional>
#include <vector>

namespace diffuse::nn {

// Whether the fused npu operators may take `x` (on the npu device, switch on, no autograd).
bool npu_fused_ops_enabled(const torch::Tensor& x);

// RMSNorm of x over its last dimension with weight `gamma`; nullopt when not taken.
std::optional<torch::Tensor> npu_rms_norm(const torch::Tensor& x, const torch::Tensor& gamma,
                                          double eps);

// Adjacent-pair rotation of x [B, S, H, 2R] by angles with cos/sin [S, R] (float32):
// rotary_mode "interleave" with r1/r2 = cos/sin repeated per pair. nullopt when not taken.
std::optional<torch::Tensor> npu_rotary_mul_interleaved(const torch::Tensor& x,
                                                        const torch::Tensor& cos,
                                                        const torch::Tensor& sin);

// y_i = x_i @ w_i for each group (x_i [M_i, K], w_i [K, N]); nullopt when not taken.
std::optional<std::vector<torch::Tensor>> npu_grouped_matmul(const std::vector<torch::Tensor>& x,
                                                             const std::vector<torch::Tensor>& w);

// Re-enables kernels disabled after a failure (tests).
void reset_npu_fused_op_failures();

}  // namespace diffuse::nn
