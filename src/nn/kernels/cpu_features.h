// What the running CPU can execute, for choosing among the per-ISA kernels.
#pragma once
#include <vector>

#include "nn/kernels/cpu_kernels.h"

namespace diffuse::nn::kernels {

struct CpuFeatures {
  bool avx2_fma = false;
  bool avx512 = false;       // F, BW, VL, DQ
  bool avx512_bf16 = false;  // VDPBF16PS / VCVTNEPS2BF16
  bool avx512_vnni = false;  // VPDPBUSD: 8-bit products summed into int32 (nn/int8_linear.h)
  // AMX tiles with bf16 products, which oneDNN's bf16 matmuls and convolutions use (false when
  // ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA caps oneDNN below AMX).
  bool amx_bf16 = false;
};

// $DIFFUSE_CPU_ISA: what the engine treats this CPU as having, so that the paths of other CPUs
// can be measured side by side on one machine. "avx512" drops native bf16 and AMX (an older
// Xeon; VNNI too), "avx2" drops AVX-512 as well (an AVX2-only desktop or EPYC: the auto dtype
// policy then picks float32), "baseline" drops AVX2; unset or "native" keeps everything. It caps
// our own kernels and the dtype policy; the math libraries read their own switches
// (DNNL_MAX_CPU_ISA, OPENBLAS_CORETYPE: scripts/bench_isa.sh sets all of them).
enum class IsaCap { native, avx512, avx2, baseline };
IsaCap isa_cap();  // throws InvalidArgument naming the variable for an unknown value
const char* isa_cap_name(IsaCap cap);

const CpuFeatures& cpu_features();  // with the cap applied

// Fused-op kernels runnable here, best first (the last is always the portable one).
const std::vector<const CpuKernels*>& runnable_cpu_kernels();
// The one the engine uses: the best, or $DIFFUSE_CPU_KERNELS (portable|avx2|avx512) if set.
const CpuKernels& cpu_kernels();

}  // namespace diffuse::nn::kernels
