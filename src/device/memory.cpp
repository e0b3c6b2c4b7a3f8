#include "device/memory.h"

#include <fstream>
#include <string>

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

}  // namespace diffuse::device
