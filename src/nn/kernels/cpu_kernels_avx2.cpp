// The fused bf16 kernels compiled with -mavx2 -mfma (set by CMake on x86-64).
#include "nn/kernels/cpu_kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#define CPU_KERNELS_NAME "avx2"
#define CPU_KERNELS_GETTER avx2_cpu_kernels
#include "nn/kernels/cpu_kernels_impl.h"
#else
namespace diffuse::nn::kernels {
const CpuKernels* avx2_cpu_kernels() {
  return nullptr;
}
}  // namespace diffuse::nn::kernels
#endif
