// CUDA specifics that need CUDA headers (allocator statistics, device properties). Compiled
// only when the libtorch has CUDA (DIFFUSE_WITH_CUDA, set by CMake from TORCH_CUDA_LIBRARIES);
// otherwise every function reports "unknown" and the CPU build needs nothing extra.
#pragma once
#include <c10/core/Device.h>

#include <string>

#include "device/memory.h"

namespace diffuse::device::cuda {

struct Properties {
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;
  int64_t total_bytes = 0;
};

// False when this build has no CUDA support compiled in.
bool compiled_with_cuda();
bool properties(c10::DeviceIndex index, Properties* out);
bool allocator_stats(c10::DeviceIndex index, AllocatorStats* out);
void reset_peak(c10::DeviceIndex index);
void empty_cache();

}  // namespace diffuse::device::cuda
