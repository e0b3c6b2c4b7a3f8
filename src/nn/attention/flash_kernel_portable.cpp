// The portable flash kernel compiled for the baseline instruction set: runs on any CPU.
#define FLASH_KERNEL_NAME "portable"
#define FLASH_KERNEL_GETTER portable_kernel
#include "nn/attention/flash_kernel_portable.h"
