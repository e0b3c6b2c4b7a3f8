#include "bench/roofline.h"

#include <torch/torch.h>

#include <chrono>

#include "bench/bench_util.h"
#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"

namespace diffuse::bench {

Roofline measure_roofline(const torch::Device& device, torch::Dtype dtype, bool channels_last,
                          double min_seconds) {
  torch::InferenceMode guard;
  device::configure_cpu_threads();
  // Under the engine's heap policy: with glibc's default every output above 32 MiB (here the
  // 8192 x 2560 GEGLU projection's) is a fresh mmap per call, and its page faults, not the
  // matmul, set that shape's rate.
  device::set_cpu_memory_policy();
  Roofline r;
  r.device = device::device_name(device);
  r.dtype = device::dtype_name(dtype);
  r.channels_last = channels_last;
  auto opts = torch::TensorOptions().device(device).dtype(dtype);
  // Linear layers of SD2's UNet at 512x512, batch 2: tokens x in -> out.
  const int64_t mm[][3] = {{8192, 320, 320},  {8192, 320, 2560},  {8192, 1280, 320},
                           {2048, 640, 5120}, {512, 1280, 10240}, {2048, 640, 640}};
  for (const auto& s : mm) {
    auto x = torch::randn({s[0], s[1]}, opts), w = torch::randn({s[2], s[1]}, opts) * 0.05;
    RooflineEntry e;
    e.kind = "matmul";
    e.shape = std::to_string(s[0]) + "x" + std::to_string(s[1]) + " @ " + std::to_string(s[1]) +
              "x" + std::to_string(s[2]);
    e.gflop = 2.0 * s[0] * s[1] * s[2] / 1e9;
    e.seconds = best_time(
        [&] {
          torch::linear(x, w);
          sync_device(device);
        },
        min_seconds, 2, 51);
    r.matmul_gflops = std::max(r.matmul_gflops, e.gflops());
    r.entries.push_back(e);
  }
  // 3x3 convolutions of its resnets: batch x channels x height x width.
  const int64_t cv[][4] = {{2, 320, 64, 64}, {2, 640, 32, 32}, {2, 1280, 16, 16}, {2, 1280, 8, 8}};
  const auto fmt =
      channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
  for (const auto& s : cv) {
    auto x = torch::randn({s[0], s[1], s[2], s[3]}, opts).contiguous(fmt);
    auto w = (torch::randn({s[1], s[1], 3, 3}, opts) * 0.02).contiguous(fmt);
    auto b = torch::zeros({s[1]}, opts);
    RooflineEntry e;
    e.kind = "conv";
    e.shape = std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]) + "x" +
              std::to_string(s[3]) + " conv3x3 -> " + std::to_string(s[1]);
    e.gflop = 2.0 * s[0] * s[1] * s[1] * 9 * s[2] * s[3] / 1e9;
    e.seconds = best_time(
        [&] {
          torch::conv2d(x, w, b, 1, 1);
          sync_device(device);
        },
        min_seconds, 2, 51);
    r.conv_gflops = std::max(r.conv_gflops, e.gflops());
    r.entries.push_back(e);
  }
  return r;
}

}  // namespace diffuse::bench
