// Peak-memory measurement for benchmarks: the kernel's peak-RSS mark (VmHWM) can be reset, so
// the peak of one stage is measured on its own.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>

namespace diffuse::bench {

// Resets the peak-RSS mark to the current RSS (Linux /proc/self/clear_refs); false where the
// system does not allow it (then peaks are process-wide).
bool reset_peak_rss();

int64_t current_rss_bytes();
int64_t peak_rss_bytes();

// Starts a new peak window of the device's allocator; returns the bytes its tensors held at the
// peak since, or -1 where there is no allocator with statistics (the CPU; some backends).
void reset_device_peak(const c10::Device& device);
int64_t device_peak_bytes(const c10::Device& device);

}  // namespace diffuse::bench
