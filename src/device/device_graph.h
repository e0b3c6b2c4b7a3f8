// Graph replay of one fixed-shape call (a UNet step): CUDA graphs on CUDA, torch_npu's
// NPUGraph (aclgraph) on Ascend. A 512x512 SD UNet step launches about a thousand kernels; on
// a fast accelerator the host's launches, not the kernels, set its pace (the H200 ran the fp16
// step at 2.3x its roofline). A graph records the launches once and replays them with one
// call. Where the device or the build cannot, available() is false and capture() throws
// Unsupported, saying why (always on the CPU: there is nothing to record).
#pragma once
#include <torch/types.h>

#include <functional>
#include <string>

namespace diffuse::device {

class DeviceGraph {
 public:
  DeviceGraph() = default;
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;

  // Whether this build can capture graphs on `device`.
  static bool available(const torch::Device& device);
  // Why not, in words ("" when available).
  static std::string unavailable_reason(const torch::Device& device);

  // Runs `fn` `warmup` times on a side stream (library handles, kernel plans and the
  // allocator's blocks are made outside the capture), then records one call of it. `fn` reads
  // its inputs from and writes its outputs to tensors that outlive the graph: replay() re-runs
  // the recorded kernels on the same addresses. It must not wait for the host (no .item(), no
  // copy from host memory). Throws what the capture threw; the graph is then empty.
  void capture(const torch::Device& device, const std::function<void()>& fn, int warmup = 2);
  // Re-runs the recorded kernels on the current stream.
  void replay();
  bool captured() const { return static_cast<bool>(replay_); }
  // Drops the recording (and the memory pool its tensors came from).
  void reset() { replay_ = nullptr; }

 private:
  std::function<void()> replay_;  // owns the recording
};

}  // namespace diffuse::device
