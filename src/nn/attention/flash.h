// Introspection of the `flash` backend's CPU kernels, for tests and benchmarks. Models never
// call these: they go through nn::attention().
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

#include "nn/attention.h"

namespace diffuse::nn {

// Flash kernels this CPU can run for `dtype`, best first: "avx512-bf16" (bf16 only),
// "avx512", "avx2", "portable".
std::vector<std::string> flash_kernel_names(torch::Dtype dtype);

// The kernel the flash backend uses for `dtype` (env DIFFUSE_FLASH_KERNEL forces one).
std::string flash_kernel_name(torch::Dtype dtype);

// Flash attention with a named kernel. InvalidArgument if the kernel is not runnable here or
// the inputs are not flash's (CPU, float32/bfloat16, same head dim for q, k and v).
torch::Tensor flash_attention_with_kernel(const std::string& kernel, const torch::Tensor& q,
                                          const torch::Tensor& k, const torch::Tensor& v,
                                          const AttentionOptions& options = {});

}  // namespace diffuse::nn
