#include "bench/memory_probe.h"

#include <fstream>

#include "device/memory.h"

namespace diffuse::bench {

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

int64_t current_rss_bytes() {
  return device::memory_stats().rss_bytes;
}
int64_t peak_rss_bytes() {
  return device::memory_stats().peak_rss_bytes;
}

}  // namespace diffuse::bench
