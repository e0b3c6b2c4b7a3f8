#include "device/cuda_backend.h"

#include <ATen/Context.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#ifdef DIFFUSE_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace diffuse::device::cuda {

bool tf32_allowed() {
  const char* env = std::getenv("DIFFUSE_ALLOW_TF32");
  return env && std::strcmp(env, "1") == 0;
}

bool cudnn_benchmark() {
  const char* env = std::getenv("DIFFUSE_CUDNN_BENCHMARK");
  return env && std::strcmp(env, "1") == 0;
}

void apply_float32_precision() {
  static std::once_flag once;
  std::call_once(once, [] {
    const bool tf32 = tf32_allowed();
    at::globalContext().setAllowTF32CuDNN(tf32);
    at::globalContext().setAllowTF32CuBLAS(tf32);
    at::globalContext().setBenchmarkCuDNN(cudnn_benchmark());
  });
}

#ifdef DIFFUSE_WITH_CUDA

namespace {

// "cuda" without an index means the current device; the allocator's and the runtime's calls
// take only a real index.
c10::DeviceIndex concrete_index(c10::DeviceIndex index) {
  return index >= 0 ? index : c10::cuda::current_device();
}

}  // namespace

bool compiled_with_cuda() {
  return true;
}

bool properties(c10::DeviceIndex index, Properties* out) {
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(concrete_index(index));
  if (!p) return false;
  out->name = p->name;
  out->major = p->major;
  out->minor = p->minor;
  out->total_bytes = static_cast<int64_t>(p->totalGlobalMem);
  return true;
}

bool allocator_stats(c10::DeviceIndex index, AllocatorStats* out) {
  namespace A = c10::cuda::CUDACachingAllocator;
  index = concrete_index(index);
  // Before the process's first CUDA allocation the caching allocator has no devices yet, and
  // LibTorch 2.11 throws "Invalid device argument" (the stage bench failed at once on an H200
  // when its first stage asked): nothing allocated means nothing to report.
  decltype(A::getDeviceStats(index)) stats;  // the type moved namespaces in 2.x
  try {
    stats = A::getDeviceStats(index);
  } catch (const c10::Error&) {
    return false;
  }
  // Index 0 is StatType::AGGREGATE in every libtorch release (the enum moved namespaces in 2.x).
  const auto& allocated = stats.allocated_bytes[0];
  const auto& reserved = stats.reserved_bytes[0];
  out->allocated_bytes = allocated.current;
  out->peak_allocated_bytes = allocated.peak;
  out->reserved_bytes = reserved.current;
  out->peak_reserved_bytes = reserved.peak;
  Properties props;
  if (properties(index, &props)) out->total_bytes = props.total_bytes;
  return true;
}

void reset_peak(c10::DeviceIndex index) {
  try {
    c10::cuda::CUDACachingAllocator::resetPeakStats(concrete_index(index));
  } catch (const c10::Error&) {  // no allocation yet (see allocator_stats): no peak to reset
  }
}

void empty_cache() {
  c10::cuda::CUDACachingAllocator::emptyCache();
}

#else

bool compiled_with_cuda() {
  return false;
}
bool properties(c10::DeviceIndex, Properties*) {
  return false;
}
bool allocator_stats(c10::DeviceIndex, AllocatorStats*) {
  return false;
}
void reset_peak(c10::DeviceIndex) {}
void empty_cache() {}

#endif

}  // namespace diffuse::device::cuda
