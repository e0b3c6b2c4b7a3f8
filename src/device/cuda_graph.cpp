#include "device/cuda_graph.h"

#include "diffuse/errors.h"

#ifdef DIFFUSE_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace diffuse::device {

#ifdef DIFFUSE_CUDA_GRAPHS

struct CudaGraph::Impl {
  std::unique_ptr<at::cuda::CUDAGraph> graph;
};

std::string CudaGraph::unavailable_reason(const torch::Device& device) {
  if (!device.is_cuda()) return "CUDA graphs replay CUDA kernels; this runs on " + device.str();
  return "";
}

void CudaGraph::capture(const torch::Device& device, const std::function<void()>& fn, int warmup) {
  if (const auto why = unavailable_reason(device); !why.empty()) throw Unsupported(why);
  reset();
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  c10::cuda::CUDAGuard device_guard(index);
  // The side stream starts after everything queued so far (the inputs' copies).
  c10::cuda::device_synchronize();
  auto side = c10::cuda::getStreamFromPool(false, index);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
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
  impl_->graph = std::move(graph);
}

void CudaGraph::replay() {
  if (!impl_->graph) throw InvalidArgument("CudaGraph::replay: nothing was captured");
  impl_->graph->replay();
}

#else

struct CudaGraph::Impl {
  bool graph = false;
};

std::string CudaGraph::unavailable_reason(const torch::Device& device) {
  if (!device.is_cuda()) return "CUDA graphs replay CUDA kernels; this runs on " + device.str();
  return "this build has no CUDA graphs (a CUDA LibTorch and DIFFUSE_CUDA_GRAPHS=ON are needed)";
}

void CudaGraph::capture(const torch::Device& device, const std::function<void()>&, int) {
  throw Unsupported(unavailable_reason(device));
}

void CudaGraph::replay() {
  throw InvalidArgument("CudaGraph::replay: nothing was captured");
}

#endif

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;

bool CudaGraph::available(const torch::Device& device) {
  return unavailable_reason(device).empty();
}

bool CudaGraph::captured() const {
  return static_cast<bool>(impl_->graph);
}

void CudaGraph::reset() {
  impl_->graph = {};
}

}  // namespace diffuse::device
