// CUDA graphs, for DeviceGraph (device_graph.h) only. Compiled with the graph API only in a
// CUDA build with DIFFUSE_CUDA_GRAPHS (CMakeLists.txt), so a LibTorch whose graph API differs
// builds without it by recompiling this one file.
#pragma once
#include <torch/types.h>

#include <functional>
#include <string>

namespace diffuse::device {

// Why `device` (a CUDA device) cannot capture here, in words; "" when it can.
std::string cuda_graph_unavailable_reason(const torch::Device& device);

// Runs `fn` `warmup` times on a side stream, records one call of it in an at::cuda::CUDAGraph
// and returns what replays the recording (and owns it). See DeviceGraph::capture.
std::function<void()> capture_cuda_graph(const torch::Device& device,
                                         const std::function<void()>& fn, int warmup);

}  // namespace diffuse::device
