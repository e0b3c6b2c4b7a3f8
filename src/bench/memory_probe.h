// Peak-memory measurement for benchmarks: the kernel's peak-RSS mark (VmHWM) can be reset, so
// the peak of one stage is measured on its own.
#pragma once
#include <cstdint>

namespace diffuse::bench {

// Resets the peak-RSS mark to the current RSS (Linux /proc/self/clear_refs); false where the
// system does not allow it (then peaks are process-wide).
bool reset_peak_rss();

int64_t current_rss_bytes();
int64_t peak_rss_bytes();

}  // namespace diffuse::bench
