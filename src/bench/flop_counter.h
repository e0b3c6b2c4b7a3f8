// Counts the floating-point work of whatever runs on this thread while a FlopCounter is alive,
// from the shapes of the operators LibTorch dispatches (a RecordFunction observer) plus the
// engine's own nn::attention calls. A multiply-add counts as 2; only convolutions, linear
// layers / matrix products and attention are counted (norms, activations and element-wise
// ops are not), which is the convention of published UNet FLOP counts.
#pragma once
#include <cstdint>
#include <memory>

namespace diffuse::bench {

struct FlopCounts {
  double conv = 0;       // convolutions
  double matmul = 0;     // linear layers and matrix products outside attention
  double attention = 0;  // q k^T and p v of nn::attention calls
  // The part of `conv` that ran by Winograd (nn/winograd_conv.h), counted as the direct
  // convolution's FLOPs like the rest: it multiplies 2.25-4x less than that.
  double conv_winograd = 0;
  double total() const { return conv + matmul + attention; }
};

class FlopCounter {
 public:
  FlopCounter();   // starts counting on the calling thread
  ~FlopCounter();  // stops
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  const FlopCounts& counts() const { return *counts_; }

 private:
  std::unique_ptr<FlopCounts> counts_;
  uint64_t handle_;
};

}  // namespace diffuse::bench
