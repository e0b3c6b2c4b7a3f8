#include "device/memory.h"

#include <algorithm>
#include <fstream>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "device/cpu_allocator.h"
#include "device/cuda_backend.h"
#include "device/device.h"
#include "device/npu_backend.h"

namespace diffuse::device {

MemoryStats memory_stats() {
  MemoryStats s;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    auto kb = [&](const char* key) -> int64_t {
      return std::stoll(line.substr(std::string(key).size())) * 1024;
    };
    if (line.rfind("VmRSS:", 0) == 0) s.rss_bytes = kb("VmRSS:");
    if (line.rfind("VmHWM:", 0) == 0) s.peak_rss_bytes = kb("VmHWM:");
  }
  return s;
}

DeviceMemory device_memory(const torch::Device& device) {
  DeviceMemory m;
  m.device = device_name(device);
  m.process = memory_stats();
  auto index = device.has_index() ? device.index() : c10::DeviceIndex(0);
  if (device.is_cuda()) {
    m.has_allocator = cuda::allocator_stats(index, &m.allocator);
  } else if (device.type() == c10::DeviceType::PrivateUse1) {
    const NpuBackend* b = npu_backend();
    if (b && b->memory_stats) {
      m.allocator = b->memory_stats(index);
      m.has_allocator = true;
    }
  }
  return m;
}

int64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemAvailable:") return kb * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

int64_t available_bytes(const torch::Device& device) {
  if (device.is_cpu()) return host_available_bytes();
  const auto m = device_memory(device);
  if (!m.has_allocator || m.allocator.total_bytes <= 0) return 0;
  return std::max<int64_t>(0, m.allocator.total_bytes - m.allocator.reserved_bytes);
}

void reset_peak_memory(const torch::Device& device) {
  auto index = device.has_index() ? device.index() : c10::DeviceIndex(0);
  if (device.is_cuda()) {
    cuda::reset_peak(index);
  } else if (device.type() == c10::DeviceType::PrivateUse1) {
    const NpuBackend* b = npu_backend();
    if (b && b->reset_peak_memory) b->reset_peak_memory(index);
  }
}

void empty_cache(const torch::Device& device, HeapRelease cpu) {
  if (device.is_cpu()) {
#if defined(__GLIBC__)
    if (cpu == HeapRelease::kAll)
      malloc_trim(0);
    else
      trim_heap();
#else
    (void)cpu;
#endif
  } else if (device.is_cuda()) {
    cuda::empty_cache();
  } else if (device.type() == c10::DeviceType::PrivateUse1) {
    const NpuBackend* b = npu_backend();
    if (b && b->empty_cache) b->empty_cache();
  }
}

}  // namespace diffuse::device
