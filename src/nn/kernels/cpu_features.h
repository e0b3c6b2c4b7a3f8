// What the running CPU can execute, for choosing among the per-ISA kernels.
#pragma once
#include <vector>

#include "nn/kernels/cpu_kernels.h"

namespace diffuse::nn::kernels {

struct CpuFeatures {
  bool avx2_fma = false;
  bool avx512 = false;       // F, BW, VL, DQ
  bool avx512_bf16 = false;  // VDPBF16PS / VCVTNEPS2BF16
};

const CpuFeatures& cpu_features();

// Fused-op kernels runnable here, best first (the last is always the portable one).
const std::vector<const CpuKernels*>& runnable_cpu_kernels();
// The one the engine uses: the best, or $DIFFUSE_CPU_KERNELS (portable|avx2|avx512) if set.
const CpuKernels& cpu_kernels();

}  // namespace diffuse::nn::kernels
