// Fused attention on the Ascend NPU: torch_npu's npu::npu_fusion_attention (Atlas A2-class)
// and npu::npu_prompt_flash_attention (also Atlas 310P inference cards, fp16 only), looked up
// through the dispatcher by schema name, so this compiles and links without torch_npu. Which
// kernel runs depends on what the device supports (device::NpuCapabilities); anything else
// takes the default attention path. Registered as AttentionBackend::kNpu by attention.cpp.
#pragma once
#include <torch/types.h>

#include "nn/attention.h"

namespace diffuse::nn {

enum class NpuAttentionKernel { kNone, kFusionAttention, kPromptFlashAttention };
const char* npu_attention_kernel_name(NpuAttentionKernel kernel);

// The fused kernel that would run for q ([B, H, N, D] on the npu device), or kNone.
NpuAttentionKernel select_npu_attention_kernel(const torch::Tensor& q,
                                               const AttentionOptions& options);

bool npu_attention_supports(const torch::Tensor& q, const AttentionOptions& options);
// q, k, v: [B, H, N, D]. options.scale is passed explicitly (attention() always sets it).
// When the fused kernel throws, it is disabled for the rest of the process with one warning
// and the math path answers instead.
torch::Tensor npu_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const AttentionOptions& options);

// Re-enables kernels disabled after a failure (tests).
void reset_npu_attention_failures();

}  // namespace diffuse::nn
