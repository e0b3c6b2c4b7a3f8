// The single attention entry point of the engine. Models call nn::attention() and never a
// kernel directly, so backends (math, sdpa, flash, npu) can be swapped by policy.
#pragma once
#include <torch/types.h>

#include <optional>
#include <string>

namespace diffuse::nn {

enum class AttentionBackend { kAuto, kMath, kSdpa, kFlash, kNpu };

struct AttentionOptions {
  // Softmax scale; default 1/sqrt(head_dim).
  std::optional<double> scale;
  bool causal = false;
  // Compute q·k and softmax in float32 even for bf16/fp16 inputs (diffusers' upcast_attention).
  bool upcast = false;
  AttentionBackend backend = AttentionBackend::kAuto;
};

// q: [B, H, Nq, D], k and v: [B, H, Nk, D]  ->  [B, H, Nq, D], same dtype as q.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const AttentionOptions& options = {});

// "auto", "math", ... ; InvalidArgument naming the accepted values otherwise.
AttentionBackend parse_attention_backend(const std::string& name);
const char* attention_backend_name(AttentionBackend backend);

// Process-wide default used when options.backend is kAuto (set from --attention /
// DIFFUSE_ATTENTION by the front ends).
void set_default_attention_backend(AttentionBackend backend);
AttentionBackend default_attention_backend();

// Backends registered at run time (the npu fused kernels, see attention_npu.h). `supports`
// says whether the kernel takes these inputs; when it does not, attention() uses math.
using AttentionKernel = torch::Tensor (*)(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const AttentionOptions& options);
using AttentionSupports = bool (*)(const torch::Tensor& q, const AttentionOptions& options);
void register_attention_backend(AttentionBackend backend, AttentionKernel kernel, AttentionSupports supports);

}  // namespace diffuse::nn
