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

// CFG-parallel and/or Ulysses: the world of options.world = cfg_ways x N ranks meets as
// connect_group does, then splits. Rank r holds guidance-branch share r / N and, within it,
// token share r % N: `sequence` joins the N ranks of its branch share (null when N is 1),
// `cfg` the cfg_ways ranks of its token share (null when cfg_ways is 1); a split one way only
// is the world group itself. InvalidArgument when cfg_ways does not divide the world.
struct ParallelGroups {
  std::shared_ptr<RankGroup> world, cfg, sequence;
};
ParallelGroups connect_groups(const GroupOptions& options, int cfg_ways);

}  // namespace diffuse::parallel
