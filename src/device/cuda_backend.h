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

// float32 means float32: LibTorch lets cuDNN run float32 convolutions in TF32 (10-bit
// mantissa) by default, which put the H100's fp32 images 1e-3 away from the reference and
// from the CPU's. Turns TF32 off for convolutions and matmuls unless DIFFUSE_ALLOW_TF32=1 (the
// faster, less exact choice). Applied once, when a CUDA device is first resolved.
// Also sets cuDNN's benchmark mode (time the candidate algorithms of each new convolution
// shape once, keep the fastest) from DIFFUSE_CUDNN_BENCHMARK=1; off by default.
void apply_float32_precision();
bool tf32_allowed();
bool cudnn_benchmark();

}  // namespace diffuse::device::cuda
