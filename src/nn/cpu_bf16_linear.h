// bf16 linear layers on CPUs with AVX512-BF16 through our own register-tiled product
// (kernels/bf16_gemm.h), as an alternative to LibTorch's oneDNN matmul for the few hundred rows
// text encoders run (CLIP's 77 tokens per prompt, T5/Llama's 128-512): issue 36 measured
// diffusers' bf16 text encoder faster than ours on a Zen 5 and suspected LibTorch 1.13's oneDNN
// at small row counts.
//
// $DIFFUSE_BF16_GEMM chooses: "auto" (unset: oneDNN, which measured at parity with ours on a
// Zen 4, see own_bf16_gemm_applies), "own" (ours for every product it can take), "onednn"
// (LibTorch's always), so that the two can be measured side by side (`diffuse bench gemm`).
#pragma once
#include <torch/types.h>

namespace diffuse::nn {

enum class Bf16GemmPolicy { automatic, own, onednn };
Bf16GemmPolicy bf16_gemm_policy();  // from $DIFFUSE_BF16_GEMM; throws naming it if unknown
// Overrides the environment for this process (benchmarks and tests).
void set_bf16_gemm_policy(Bf16GemmPolicy policy);

// input [..., K] @ weight[N, K]^T + bias[N] + residual[..., N] in bf16 (bias and residual may
// be undefined), summed in float32 and rounded once, when our kernel applies to these tensors
// under the policy: bf16 CPU tensors outside autograd, a contiguous weight, a CPU with
// AVX512-BF16. Otherwise an undefined tensor, and the caller takes LibTorch's path.
torch::Tensor cpu_bf16_linear(const torch::Tensor& input, const torch::Tensor& weight,
                              const torch::Tensor& bias = {}, const torch::Tensor& residual = {});

// Whether cpu_bf16_linear would take these rows under the current policy on this CPU.
bool own_bf16_gemm_applies(int64_t rows);

}  // namespace diffuse::nn
