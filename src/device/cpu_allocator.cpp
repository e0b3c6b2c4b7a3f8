#include "device/cpu_allocator.h"

#include <cstdlib>
#include <fstream>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace diffuse::device {

bool keep_freed_memory() {
  static const bool active = [] {
    const char* flag = std::getenv("DIFFUSE_KEEP_FREED_MEMORY");
    if (flag && std::string(flag) == "0") return false;
    for (const char* user :
         {"MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
      if (std::getenv(user)) return false;
#if defined(__GLIBC__)
    return mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 &&
           mallopt(M_TOP_PAD, 256 << 20) == 1;
#else
    return false;
#endif
  }();
  return active;
}

std::string transparent_huge_pages_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "";
  const auto open = line.find('['), close = line.find(']');
  return open != std::string::npos && close != std::string::npos && close > open
             ? line.substr(open + 1, close - open - 1)
             : "";
}

}  // namespace diffuse::device
