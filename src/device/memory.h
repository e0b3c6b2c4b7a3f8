// Memory statistics: process RSS (current and peak) for the CPU, allocator statistics for
// accelerators where the linked backend exposes them (CUDA caching allocator, torch_npu's
// NPU caching allocator), and empty_cache.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace diffuse::device {

struct MemoryStats {
  int64_t rss_bytes = 0;
  int64_t peak_rss_bytes = 0;
};

// This process's resident memory (VmRSS / VmHWM).
MemoryStats memory_stats();

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // held by live tensors
  int64_t reserved_bytes = 0;   // held by the caching allocator (>= allocated)
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t total_bytes = 0;  // device memory size; 0 = unknown
};

struct DeviceMemory {
  std::string device;          // "cpu", "cuda:0", "npu:0"
  MemoryStats process;         // always filled
  bool has_allocator = false;  // false on the CPU and where the backend has no statistics
  AllocatorStats allocator;
};

DeviceMemory device_memory(const torch::Device& device);
// Memory a new allocation on `device` can still get: MemAvailable of the host for the CPU,
// total minus reserved for a device with an allocator; 0 when unknown.
int64_t available_bytes(const torch::Device& device);
// /proc/meminfo's MemAvailable (0 if unknown).
int64_t host_available_bytes();
// Starts a new peak window for the device's allocator (no-op on the CPU).
void reset_peak_memory(const torch::Device& device);
// What empty_cache gives back on the CPU.
enum class HeapRelease {
  // On a heap of transparent huge pages, glibc's trim releases the free 4 KiB pages inside
  // huge pages, which splits each into 4 KiB mappings for the rest of the process: on SD2.1
  // at 512, ~390 MiB of later activations sat on 4 KiB pages, and the next image's UNet steps
  // ran 5-10 % and its decode ~6 % slower. So there the trim is followed by rebuilding the huge
  // pages it split (device::trim_heap_keeping_huge_pages: MADV_COLLAPSE, Linux >= 6.1; ~2,000
  // calls, 0.06 s, for a 4 GiB heap), and where the kernel cannot, freed memory stays in the
  // heap for the next stage to reuse.
  kKeepHugePages,
  // Always (memory before speed: offloading, measuring a stage's own peak).
  kAll,
};

// Returns cached, unused blocks of the device's allocator to the driver; on the CPU, returns
// free malloc heap pages to the OS (glibc keeps freed activations otherwise, and they would
// count in the next stage's peak) as `cpu` says.
void empty_cache(const torch::Device& device, HeapRelease cpu = HeapRelease::kKeepHugePages);

}  // namespace diffuse::device
