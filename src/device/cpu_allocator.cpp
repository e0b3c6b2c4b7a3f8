#include "device/cpu_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace diffuse::device {
namespace {
constexpr int kHeapTopPad = 256 << 20;  // what the heap grows by beyond a request
}  // namespace

bool keep_freed_memory() {
  static const bool active = [] {
    const char* flag = std::getenv("DIFFUSE_KEEP_FREED_MEMORY");
    if (flag && std::string(flag) == "0") return false;
    for (const char* user :
         {"MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
      if (std::getenv(user)) return false;
#if defined(__GLIBC__)
    return mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 &&
           mallopt(M_TOP_PAD, kHeapTopPad) == 1;
#else
    return false;
#endif
  }();
  return active;
}

namespace {
std::mutex g_large_buffers_mutex;
int g_large_buffer_scopes = 0;
}  // namespace

LargeBuffersReturnedWhenFreed::LargeBuffersReturnedWhenFreed() {
  if (!keep_freed_memory()) return;
  std::lock_guard<std::mutex> lock(g_large_buffers_mutex);
#if defined(__GLIBC__)
  if (g_large_buffer_scopes++ == 0) {
    // glibc maps a large buffer only where the heap's top cannot hold it: the top is trimmed
    // and kept small while the scope lasts.
    mallopt(M_TOP_PAD, 0);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_MMAP_MAX, 1 << 16);
    trim_heap();
  }
#endif
}

LargeBuffersReturnedWhenFreed::~LargeBuffersReturnedWhenFreed() {
  if (!keep_freed_memory()) return;
  std::lock_guard<std::mutex> lock(g_large_buffers_mutex);
#if defined(__GLIBC__)
  // Buffers mapped meanwhile are still unmapped when freed: glibc marks each chunk. Those that
  // reused a freed chunk of the heap instead give their pages back now.
  if (--g_large_buffer_scopes == 0) {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TOP_PAD, kHeapTopPad);
    trim_heap();
  }
#endif
}

}  // namespace diffuse::device

// oneDNN's C API, looked up weakly: null where no libdnnl is linked (the header is optional).
extern "C" int dnnl_set_primitive_cache_capacity(int capacity) __attribute__((weak));

namespace diffuse::device {

int bound_onednn_primitive_cache() {
  static const int capacity = [] {
    for (const char* user : {"ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY"})
      if (std::getenv(user)) return -1;
    constexpr int kCapacity = 64;
    ::setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", std::to_string(kCapacity).c_str(), 0);
    if (dnnl_set_primitive_cache_capacity) dnnl_set_primitive_cache_capacity(kCapacity);
    return kCapacity;
  }();
  return capacity;
}

void set_cpu_memory_policy() {
  keep_freed_memory();
  bound_onednn_primitive_cache();
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

namespace {

// glibc.malloc.hugetlb from GLIBC_TUNABLES: 0 (unset), 1 (THP via madvise) or 2 (hugetlbfs).
int malloc_hugetlb_tunable() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (!tunables) return 0;
  const std::string t = tunables;
  if (t.find("glibc.malloc.hugetlb=2") != std::string::npos) return 2;
  return t.find("glibc.malloc.hugetlb=1") != std::string::npos ? 1 : 0;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
uintptr_t huge_page_at_or_above(uintptr_t address) {
  return (address + kHugePage - 1) / kHugePage * kHugePage;
}

// Whether this kernel collapses anonymous memory into huge pages on request: tried once on a
// scratch mapping with one page touched.
bool kernel_collapses_huge_pages() {
  static const bool supported = [] {
    const size_t size = 2 * kHugePage;
    void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return false;
    const uintptr_t aligned = huge_page_at_or_above(reinterpret_cast<uintptr_t>(map));
    *reinterpret_cast<volatile char*>(aligned) = 1;
    const bool ok = ::madvise(reinterpret_cast<void*>(aligned), kHugePage, MADV_COLLAPSE) == 0;
    ::munmap(map, size);
    return ok;
  }();
  return supported;
}

// The span of the [heap] mappings (glibc's main arena, where the large buffers live under the
// heap policy): several, where parts of it differ in their flags (glibc advises huge pages on
// each extension).
bool brk_heap_range(uintptr_t* begin, uintptr_t* end) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  *begin = UINTPTR_MAX;
  *end = 0;
  while (std::getline(maps, line)) {
    if (line.size() < 6 || line.compare(line.size() - 6, 6, "[heap]") != 0) continue;
    const auto dash = line.find('-'), space = line.find(' ');
    if (dash == std::string::npos || space == std::string::npos || space < dash) continue;
    *begin = std::min<uintptr_t>(*begin, std::stoull(line.substr(0, dash), nullptr, 16));
    *end = std::max<uintptr_t>(*end,
                               std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16));
  }
  return *end > *begin;
}

}  // namespace

bool malloc_requests_huge_pages() {
  return malloc_hugetlb_tunable() != 0;
}

bool heap_on_huge_pages() {
  const int tunable = malloc_hugetlb_tunable();
  if (tunable == 2) return true;
  const std::string mode = transparent_huge_pages_mode();
  return mode == "always" || (mode == "madvise" && tunable == 1);
}

bool trim_heap_keeping_huge_pages() {
#if defined(__GLIBC__)
  if (malloc_hugetlb_tunable() == 2 || !kernel_collapses_huge_pages()) return false;
  malloc_trim(0);
  uintptr_t begin = 0, end = 0;
  if (!brk_heap_range(&begin, &end)) return true;
  // One huge page at a time: a call over the whole heap stops at the first range it cannot
  // collapse, e.g. one the trim emptied whole (no page table left, so it needs nothing).
  for (uintptr_t at = huge_page_at_or_above(begin); at + kHugePage <= end; at += kHugePage)
    ::madvise(reinterpret_cast<void*>(at), kHugePage, MADV_COLLAPSE);
  return true;
#else
  return false;
#endif
}

void trim_heap() {
#if defined(__GLIBC__)
  if (heap_on_huge_pages())
    trim_heap_keeping_huge_pages();
  else
    malloc_trim(0);
#endif
}

}  // namespace diffuse::device
