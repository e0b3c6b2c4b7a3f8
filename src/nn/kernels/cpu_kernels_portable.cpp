// The fused bf16 kernels for the baseline instruction set: run on any CPU.
#define CPU_KERNELS_NAME "portable"
#define CPU_KERNELS_GETTER portable_cpu_kernels
#include "nn/kernels/cpu_kernels_impl.h"
