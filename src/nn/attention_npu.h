// Fused attention on the Ascend NPU: torch_npu's npu::npu_fusion_attention (Atlas A2-class)
// and npu::npu_prompt_flash_attention (also Atlas 310P inference cards, fp16 only), looked up
// through the dispatcher by schema name, so this compiles and links without torch_npu. Which
// kernel runs depends on what the device supports (device::NpuCapabilities); inputs neither
// kernel takes go to the other attention backends.
#pragma once
#include <torch/types.h>

#include <string>

#include "nn/attention.h"

namespace diffuse::nn {

// Installs the fused kernels as AttentionBackend::kNpu in nn::attention's backend table.
// Idempotent. Called by the code that runs models (pipeline, doctor), not by a static
// initialiser, which the linker may drop from a static library.
void register_npu_attention_backend();

enum class NpuAttentionKernel { kNone, kFusionAttention, kPromptFlashAttention };
const char* npu_attention_kernel_name(NpuAttentionKernel kernel);

// The fused kernel that would run for q ([B, H, N, D] on the npu device), or kNone.
NpuAttentionKernel select_npu_attention_kernel(const torch::Tensor& q);
// "" when a fused kernel takes q, else why not.
std::string npu_attention_unsupported(const torch::Tensor& q);
// "" when fused npu attention can run on `device` in this process, else why not.
std::string npu_attention_unavailable(const torch::Device& device);

// q, k, v: [B, H, N, D] on the npu device. `scale` is passed to the kernel explicitly. When
// the fused kernel throws, it is disabled for the rest of the process with one warning and
// the math backend answers instead (also when no fused kernel takes the inputs).
torch::Tensor npu_fused_attention(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, double scale, bool causal);

// Re-enables kernels disabled after a failure (tests).
void reset_npu_attention_failures();

}  // namespace diffuse::nn
