// Memory statistics: process RSS (current and peak) for the CPU, allocator statistics for
// accelerators where the linked backend exposes them.
#pragma once
#include <cstdint>

namespace diffuse::device {

struct MemoryStats {
  int64_t rss_bytes = 0;
  int64_t peak_rss_bytes = 0;
};

MemoryStats memory_stats();

}  // namespace diffuse::device
