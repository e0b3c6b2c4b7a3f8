#include "device/outside_heap.h"

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <new>

#include "device/cpu_allocator.h"

namespace diffuse::device {
namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

// Live mappings by start address and size: is_outside_heap asks here.
std::mutex g_mutex;
std::map<uintptr_t, size_t> g_live;

void unmap(void* data, size_t size) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_live.erase(reinterpret_cast<uintptr_t>(data));
  }
  ::munmap(data, size);
}

// `bytes` in whole 4 KiB pages; from 2 MiB up starting on a huge page's boundary, with the whole
// huge pages it covers advised as such where the heap uses them. Not its last, partial one: a
// huge page there would be resident whole (HiDream's 2560x2560 int8 matrices, 6.25 MiB each,
// held 1.3 GiB of such tails).
void* map_buffer(size_t bytes, size_t* mapped) {
  const size_t size = (bytes + 4095) / 4096 * 4096;
  const bool huge = bytes >= kHugePage;
  // Over-mapped by a huge page and trimmed at both ends to start on its boundary.
  const size_t span = huge ? size + kHugePage : size;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  auto begin = reinterpret_cast<uintptr_t>(raw);
  if (huge) {
    const uintptr_t aligned = (begin + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > begin) ::munmap(raw, aligned - begin);
    const uintptr_t end = aligned + size, span_end = begin + span;
    if (span_end > end) ::munmap(reinterpret_cast<void*>(end), span_end - end);
    begin = aligned;
    if (heap_on_huge_pages())
      ::madvise(reinterpret_cast<void*>(begin), bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
  }
  *mapped = size;
  return reinterpret_cast<void*>(begin);
}

}  // namespace

at::Tensor empty_outside_heap(at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  const int64_t bytes =
      c10::multiply_integers(sizes) * static_cast<int64_t>(c10::elementSize(dtype));
  if (bytes < kOutsideHeapMinBytes) return at::empty(sizes, options);
  size_t size = 0;
  void* data = map_buffer(static_cast<size_t>(bytes), &size);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_live[reinterpret_cast<uintptr_t>(data)] = size;
  }
  return at::from_blob(
      data, sizes, [size](void* p) { unmap(p, size); }, options);
}

at::Tensor copy_outside_heap(const at::Tensor& t) {
  auto out = empty_outside_heap(t.sizes(), t.scalar_type());
  out.copy_(t);
  return out;
}

bool is_outside_heap(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.numel() == 0) return false;
  const auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_live.upper_bound(p);
  if (it == g_live.begin()) return false;
  --it;
  return p < it->first + it->second;
}

int64_t outside_heap_bytes() {
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t bytes = 0;
  for (const auto& live : g_live) bytes += static_cast<int64_t>(live.second);
  return bytes;
}

}  // namespace diffuse::device
