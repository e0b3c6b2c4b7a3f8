#include "pipeline/memory_estimate.h"

#include <cstdio>
#include <limits>

namespace diffuse::pipeline {

std::string format_gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

int64_t activation_bytes(int64_t batch, int64_t channels, int64_t height, int64_t width,
                         int64_t element_bytes, int64_t copies) {
  long double v = 1;
  for (int64_t f : {batch, channels, height, width, element_bytes, copies})
    v *= static_cast<long double>(f);
  const auto max = static_cast<long double>(std::numeric_limits<int64_t>::max());
  return v >= max ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
}

}  // namespace diffuse::pipeline
