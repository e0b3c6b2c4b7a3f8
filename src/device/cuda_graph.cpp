#include "device/cuda_graph.h"

#include <memory>

#include "diffuse/errors.h"

#ifdef DIFFUSE_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace diffuse::device {

#ifdef DIFFUSE_CUDA_GRAPHS

std::string cuda_graph_unavailable_reason(const torch::Device&) {
  return "";
}

std::function<void()> capture_cuda_graph(const torch::Device& device,
                                         const std::function<void()>& fn, int warmup) {
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  c10::cuda::CUDAGuard device_guard(index);
  // The side stream starts after everything queued so far (the inputs' copies).
  c10::cuda::device_synchronize();
  auto side = c10::cuda::getStreamFromPool(false, index);
  auto graph = std::make_shared<at::cuda::CUDAGraph>();
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    for (int i = 0; i < warmup; ++i) fn();
    side.synchronize();
    graph->capture_begin();
    try {
      fn();
    } catch (...) {
      try {
        graph->capture_end();
      } catch (...) {  // the capture was already broken by what fn threw
      }
      throw;
    }
    graph->capture_end();
  }
  c10::cuda::device_synchronize();
  return [graph] { graph->replay(); };
}

#else

std::string cuda_graph_unavailable_reason(const torch::Device&) {
  return "this build has no CUDA graphs (a CUDA LibTorch and DIFFUSE_CUDA_GRAPHS=ON are needed)";
}

std::function<void()> capture_cuda_graph(const torch::Device& device, const std::function<void()>&,
                                         int) {
  throw Unsupported(cuda_graph_unavailable_reason(device));
}

#endif

}  // namespace diffuse::device
