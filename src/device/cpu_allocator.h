// How the process's heap treats large CPU buffers. By default glibc serves every allocation
// above 32 MiB with a fresh mmap and unmaps it on free, so a model that allocates and frees
// the same activation-sized buffers every block pays page faults for all of them, every time:
// HiDream's blocks at 1024x1024 ran at 35 % of the matmul roofline on this machine because of
// it (22 % of the time in the kernel's fault handler), ~88 % with freed memory kept.
#pragma once
#include <string>

namespace diffuse::device {

// Once per process: large buffers come from the heap and freed memory stays there for reuse
// (mallopt: no mmap for allocations, trim only above 1 GiB, 256 MiB top pad). Skipped when
// DIFFUSE_KEEP_FREED_MEMORY=0, or when the user tuned glibc through MALLOC_MMAP_MAX_,
// MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_. Returns whether the tuning is in effect.
bool keep_freed_memory();

// For a stage that runs once per image, the VAE's decode or encode, whose full-resolution
// activations the heap would keep in pieces that the next stage's do not fit (SD2.1-base at
// 512x512 with every network resident: 3.42 -> 3.12 GiB peak; the decode's speed the same).
// While alive, a large buffer (>= 32 MiB) that no freed chunk of the heap holds comes from a
// mapping of its own again and goes back to the OS when freed, as glibc does by default (the
// heap's top is trimmed and unpadded meanwhile, else glibc carves buffers from it); when the
// last scope ends, the heap's free pages go back too. Not lower than 32 MiB: each mapped buffer
// is faulted in afresh, and with 4 MiB FLUX.1 Kontext's golden replay on 4 KiB pages took 11.0 s
// instead of 7.7 s (8.0 s at 32 MiB, the same peak for SD). No-op where keep_freed_memory is
// off; scopes nest.
class LargeBuffersReturnedWhenFreed {
 public:
  LargeBuffersReturnedWhenFreed();
  ~LargeBuffersReturnedWhenFreed();
  LargeBuffersReturnedWhenFreed(const LargeBuffersReturnedWhenFreed&) = delete;
  LargeBuffersReturnedWhenFreed& operator=(const LargeBuffersReturnedWhenFreed&) = delete;
};

// Caps how many compiled primitives oneDNN keeps (ONEDNN_PRIMITIVE_CACHE_CAPACITY, 1024 by
// default) at 64, unless the user set that variable. Each cached bf16 matmul holds its JIT
// kernels, ~3 MB: HiDream's MoE experts see a new token count in every block, so the cache
// grew by 1.7 GiB over one real-size HiDream-I1 step at 512x512 (a 17B q8_0 transformer that
// fits in 23 GiB only without it). 64 keeps every shape SD2.1's UNet repeats at a size: its
// step measured the same at 64 and 1024 (12 % slower with no cache). Sets the variable for
// oneDNN copies not yet started (LibTorch's own, where it bundles one) and the capacity of the
// linked libdnnl, which may have started. Once per process; returns the capacity in effect
// (-1 where the user's variable decides).
int bound_onednn_primitive_cache();

// What every pipeline, trainer and benchmark sets first: keep_freed_memory and
// bound_onednn_primitive_cache.
void set_cpu_memory_policy();

// The kernel's transparent-huge-page mode for anonymous memory ("always", "madvise" or
// "never"; "" where /sys does not say).
std::string transparent_huge_pages_mode();

// Whether glibc's malloc asks for huge pages (GLIBC_TUNABLES has glibc.malloc.hugetlb=1 or 2;
// the CLI restarts itself with it).
bool malloc_requests_huge_pages();

// Whether the heap's large buffers sit on huge pages: THP "always", or malloc asking for them
// under "madvise" (or hugetlbfs pages with hugetlb=2).
bool heap_on_huge_pages();

// Gives the heap's free pages back to the OS on a heap of transparent huge pages without
// leaving it on 4 KiB pages: glibc's trim releases the free 4 KiB pages inside huge pages,
// which splits each into 4 KiB mappings for the rest of the process (the kernel builds a huge
// page on a fault only where no page table is left), so the huge pages the trim split are
// rebuilt afterwards (MADV_COLLAPSE, Linux >= 6.1; their free parts become resident again).
// Returns false, trimming nothing, where the kernel cannot collapse or malloc uses hugetlbfs.
bool trim_heap_keeping_huge_pages();

// Gives the heap's free pages back to the OS: trim_heap_keeping_huge_pages on a heap of huge
// pages (freed memory stays where the kernel cannot collapse), malloc_trim otherwise.
void trim_heap();

}  // namespace diffuse::device
