// Small helpers every benchmark uses: a monotonic clock, device synchronisation before reading
// it, parameter counts, printf-style number formatting and per-stage peak memory.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "bench/memory_probe.h"

namespace diffuse::bench {

inline double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Waits for queued device work, so the clock measures it (CPU work is synchronous).
void sync_device(const torch::Device& device);

inline double params_m(const torch::nn::Module& m) {
  double n = 0;
  for (const auto& p : m.parameters()) n += static_cast<double>(p.numel());
  return n / 1e6;
}

inline std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

inline double mb(int64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// Peak RSS of one stage: resets the kernel's mark before, reads it after, and keeps the
// process-wide maximum in `overall`.
class StagePeak {
 public:
  explicit StagePeak(double* overall) : overall_(overall), reset_(reset_peak_rss()) {}
  double finish() {
    const double peak = mb(peak_rss_bytes());
    *overall_ = std::max(*overall_, peak);
    return reset_ ? peak : 0.0;
  }

 private:
  double* overall_;
  bool reset_;
};

}  // namespace diffuse::bench
