// The portable flash kernel compiled with -mavx2 -mfma (CMake sets the flags for this file on
// x86-64); flash.cpp uses it only when the CPU reports AVX2 and FMA.
#include "nn/attention/flash_kernel.h"

#if defined(__AVX2__) && defined(__FMA__)
#define FLASH_KERNEL_NAME "avx2"
#define FLASH_KERNEL_GETTER avx2_kernel
#include "nn/attention/flash_kernel_portable.h"
#else
namespace diffuse::nn::flash {
const Kernel* avx2_kernel() {
  return nullptr;
}
}  // namespace diffuse::nn::flash
#endif
