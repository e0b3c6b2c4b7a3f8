// Small helpers every benchmark uses: a monotonic clock, device synchronisation before reading
// it, parameter counts, printf-style number formatting and per-stage peak memory.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/memory_probe.h"
#include "device/memory.h"

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

// The upper middle of the values (the middle one for an odd count); 0 for none.
// Best wall time of `fn` over calls filling at least `min_seconds` (at least `min_calls`, at
// most `max_calls` of them), after a warm-up call.
template <typename Fn>
double best_time(Fn&& fn, double min_seconds, int min_calls, int max_calls) {
  fn();
  double best = 1e30, spent = 0;
  for (int i = 0; i < max_calls && (i < min_calls || spent < min_seconds); ++i) {
    const double t0 = now_s();
    fn();
    const double dt = now_s() - t0;
    best = std::min(best, dt);
    spent += dt;
  }
  return best;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

inline double mb(int64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// Peak memory of one stage: the process's RSS (resets the kernel's mark before, reads it after,
// keeps the process-wide maximum in `overall`) and, on an accelerator with allocator
// statistics, what its tensors held.
class StagePeak {
 public:
  explicit StagePeak(double* overall, const torch::Device& device = torch::kCPU)
      : overall_(overall), device_(device), reset_(reset_peak_rss()) {
    device::reset_peak_memory(device_);
  }
  // The stage's peak RSS in MiB (0 where the mark cannot be reset).
  double finish() {
    const double peak = mb(peak_rss_bytes());
    *overall_ = std::max(*overall_, peak);
    const auto memory = device::device_memory(device_);
    device_peak_mb_ = memory.has_allocator ? mb(memory.allocator.peak_allocated_bytes) : 0.0;
    return reset_ ? peak : 0.0;
  }
  // After finish(): the accelerator's peak in MiB (0 on the CPU).
  double device_peak_mb() const { return device_peak_mb_; }

 private:
  double* overall_;
  torch::Device device_;
  bool reset_;
  double device_peak_mb_ = 0;
};

}  // namespace diffuse::bench
