#include "device/device_graph.h"

#include "device/cuda_graph.h"
#include "device/npu_backend.h"
#include "diffuse/errors.h"

namespace diffuse::device {

std::string DeviceGraph::unavailable_reason(const torch::Device& device) {
  switch (device.type()) {
    case c10::DeviceType::CUDA:
      return cuda_graph_unavailable_reason(device);
    case c10::DeviceType::PrivateUse1: {
      const NpuBackend* b = npu_backend();
      if (!b) return "this build has no npu device (-DDIFFUSE_WITH_TORCH_NPU=ON)";
      if (!b->capture_graph)
        return "the " + b->name + " npu backend cannot capture graphs" +
               (b->simulated ? "" : " (torch_npu's NPUGraph needs torch_npu 2.1 or later)");
      return "";
    }
    default:
      return "graph replay records accelerator kernels (CUDA graphs, torch_npu's NPUGraph); "
             "this runs on " +
             device.str();
  }
}

bool DeviceGraph::available(const torch::Device& device) {
  return unavailable_reason(device).empty();
}

void DeviceGraph::capture(const torch::Device& device, const std::function<void()>& fn,
                          int warmup) {
  if (const auto why = unavailable_reason(device); !why.empty()) throw Unsupported(why);
  reset();
  if (device.is_cuda()) {
    replay_ = capture_cuda_graph(device, fn, warmup);
  } else {
    const auto index = device.has_index() ? device.index() : c10::DeviceIndex(0);
    replay_ = npu_backend()->capture_graph(index, fn, warmup);
  }
}

void DeviceGraph::replay() {
  if (!replay_) throw InvalidArgument("DeviceGraph::replay: nothing was captured");
  replay_();
}

}  // namespace diffuse::device
