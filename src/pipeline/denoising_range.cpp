#include "pipeline/denoising_range.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace diffuse::pipeline {

StepRange denoising_range(const torch::Tensor& timesteps, int64_t num_train_timesteps, int order,
                          double start, double end, int64_t begin) {
  const auto ts = timesteps.to(torch::kCPU, torch::kFloat64).contiguous();
  const double* t = ts.data_ptr<double>();
  const int64_t n = ts.numel();
  const double T = static_cast<double>(num_train_timesteps);
  // int(round(x)) in Python rounds halves to even, as nearbyint does in the default mode.
  const auto cutoff = [&](double fraction) { return std::nearbyint(T - fraction * T); };
  StepRange r{std::clamp<int64_t>(begin, 0, n), n};
  if (start > 0) {
    const double c = cutoff(start);
    int64_t count = 0;
    for (int64_t i = r.begin; i < n; ++i) count += t[i] < c ? 1 : 0;
    if (order == 2 && count % 2 == 0) ++count;
    r.begin = std::max<int64_t>(n - count, 0);
  }
  if (end < 1) {
    const double c = cutoff(end);
    int64_t count = 0;
    for (int64_t i = r.begin; i < n; ++i) count += t[i] >= c ? 1 : 0;
    r.end = r.begin + count;
  }
  return r;
}

}  // namespace diffuse::pipeline
