// A RankGroup over LibTorch's c10d: Gloo for CPU tensors, NCCL for CUDA, HCCL (torch_npu) for
// Ascend, each only where this build links it. The ranks meet through a store: a FileStore in a
// private folder (the local launcher's, `--devices`), or a TCPStore at MASTER_ADDR:MASTER_PORT
// (torchrun's convention: ranks on several hosts, started by torchrun, Slurm or Kubernetes).
#pragma once
#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "parallel/rank_group.h"

namespace diffuse::parallel {

struct GroupOptions {
  int rank = 0;
  int world = 0;
  torch::Device device{torch::kCPU};  // this rank's; its type picks the backend
  std::string store_file;             // the FileStore every rank opens (the launcher's), or
  std::string master_addr;            // the TCPStore's host: rank 0 serves it unless
  int master_port = 0;                // $TORCHELASTIC_USE_AGENT_STORE says torchrun's agent does
  // What every rank must agree on (model, seed, size, ...: one "key=value" per line), compared
  // at the rendezvous: a rank started with another model or seed is refused, naming the line.
  std::string job;
  std::string purpose = "CFG-parallel";  // what the group is for, in messages
  // Each collective. A peer that died is noticed at once (its sockets close); this bounds a
  // peer that hangs.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  // The rendezvous after loading: ranks wait here for the slowest model load.
  std::chrono::milliseconds startup_timeout{std::chrono::seconds(600)};
};

// "gloo", "nccl" or "hccl" for a device type; DeviceError when this build lacks it.
std::string backend_for(const torch::Device& device);

// Meets the other ranks (every rank calls this with the same store and world) and returns this
// rank's view of the group. Error naming the store, the timeout and the ranks that did not
// come, or the first line of `job` a rank disagrees on.
std::shared_ptr<RankGroup> connect_group(const GroupOptions& options);

}  // namespace diffuse::parallel
