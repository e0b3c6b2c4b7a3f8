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

// The kernel's transparent-huge-page mode for anonymous memory ("always", "madvise" or
// "never"; "" where /sys does not say).
std::string transparent_huge_pages_mode();

}  // namespace diffuse::device
