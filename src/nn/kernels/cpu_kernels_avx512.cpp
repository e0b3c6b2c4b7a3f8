// The fused bf16 kernels compiled with AVX-512 (set by CMake on x86-64).
#include "nn/kernels/cpu_kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define CPU_KERNELS_NAME "avx512"
#define CPU_KERNELS_GETTER avx512_cpu_kernels
#include "nn/kernels/cpu_kernels_impl.h"
#else
namespace diffuse::nn::kernels {
const CpuKernels* avx512_cpu_kernels() {
  return nullptr;
}
}  // namespace diffuse::nn::kernels
#endif
