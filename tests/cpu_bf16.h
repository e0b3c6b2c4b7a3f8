// For tests of bf16 behaviour (kept out of test_util.h: the parser tests link no device code).
#pragma once
#include <gtest/gtest.h>

#include "device/device.h"

namespace diffuse::test {

// Whether LibTorch runs bf16 on this CPU: oneDNN has no bf16 convolution or matmul without
// AVX-512 (an AVX2-only CPU, or scripts/bench_isa.sh avx2), and the engine refuses --dtype bf16
// there. Tests of bf16 behaviour skip on such CPUs.
inline bool cpu_runs_bf16() {
  return device::probe_dtype(torch::kCPU, torch::kBFloat16);
}
#define DIFFUSE_SKIP_WITHOUT_CPU_BF16()  \
  if (!::diffuse::test::cpu_runs_bf16()) \
  GTEST_SKIP() << "LibTorch runs no bf16 on this CPU (oneDNN's bf16 kernels need AVX-512)"

}  // namespace diffuse::test
