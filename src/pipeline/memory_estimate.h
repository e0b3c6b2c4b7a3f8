// Refuses a generation that cannot fit before it allocates anything: a lower bound of what
// its largest stages hold at once, against what the device still has. An underestimate only
// lets the allocator fail later, as before; an overestimate would refuse a run that fits, so
// the bounds count only tensors that certainly coexist.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::pipeline {

struct StageNeed {
  std::string stage;  // "UNet step", "VAE decode"
  torch::Device device = torch::kCPU;
  int64_t bytes = 0;
  std::string what;  // e.g. "4 images at 512x512"
};

// "1.5 GiB": bytes in GiB with one decimal, for messages.
std::string format_gib(int64_t bytes);

// InvalidArgument "needs about X GiB for the <stage> of <what> on <device>, Y GiB available"
// for the first stage that does not fit; devices whose free memory is unknown are not checked.
// `budget` > 0 (--max-memory): checked against it instead of what the device has free.
void check_memory_fits(const std::vector<StageNeed>& needs, int64_t budget = 0);

// The largest activation of a convolutional network's top level, `copies` of them at once:
// batch x channels x height x width x element size, computed without overflow (saturating).
int64_t activation_bytes(int64_t batch, int64_t channels, int64_t height, int64_t width,
                         int64_t element_bytes, int64_t copies);

}  // namespace diffuse::pipeline
