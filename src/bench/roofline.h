// This machine's throughput for the kernels the engine spends its time in: matrix products
// (at::linear, as the models' linear layers call it) and 3x3 convolutions (at::conv2d in the
// engine's memory format), per dtype, on shapes taken from the SD UNet. The best rate of each
// kind is the roofline the bench compares a UNet step with.
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

namespace diffuse::bench {

struct RooflineEntry {
  std::string kind;    // "matmul" | "conv"
  std::string shape;   // e.g. "8192x320 @ 320x1280", "2x320x64x64 conv3x3 -> 320"
  double gflop = 0;    // per call
  double seconds = 0;  // best of the timed calls
  double gflops() const { return seconds > 0 ? gflop / seconds : 0; }
};

struct Roofline {
  std::string device, dtype;
  bool channels_last = false;
  std::vector<RooflineEntry> entries;
  double matmul_gflops = 0;  // best matmul rate
  double conv_gflops = 0;    // best convolution rate
};

// Times each shape for at least `min_seconds` after a warm-up call.
Roofline measure_roofline(const torch::Device& device, torch::Dtype dtype, bool channels_last,
                          double min_seconds = 0.3);

}  // namespace diffuse::bench
