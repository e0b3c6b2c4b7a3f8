// A CfgGroup over LibTorch's c10d: Gloo for CPU tensors, NCCL for CUDA, HCCL (torch_npu) for
// Ascend, each only where this build links it. The ranks meet through a FileStore in a
// private folder (no listening socket beyond Gloo's own on 127.0.0.1).
#pragma once
#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "parallel/cfg_group.h"

namespace diffuse::parallel {

struct GroupOptions {
  int rank = 0;
  int world = 0;
  torch::Device device{torch::kCPU};  // this rank's; its type picks the backend
  std::string store_file;             // the FileStore every rank opens (the launcher's)
  // Each collective. A peer that died is noticed at once (its sockets close); this bounds a
  // peer that hangs.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  // The rendezvous after loading: ranks wait here for the slowest model load.
  std::chrono::milliseconds startup_timeout{std::chrono::seconds(600)};
};

// "gloo", "nccl" or "hccl" for a device type; DeviceError when this build lacks it.
std::string backend_for(const torch::Device& device);

// Meets the other ranks (every rank calls this with the same store_file and world) and
// returns this rank's view of the group. Error naming the store and timeout on failure.
std::shared_ptr<CfgGroup> connect_group(const GroupOptions& options);

}  // namespace diffuse::parallel
