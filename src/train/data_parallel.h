// Data parallelism on one CPU: a training step's batch split into shards that run forward and
// backward at once, one thread each.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "device/cpu_threads.h"

namespace diffuse::train {

// A tiny model's step is thousands of small operators, each too small for LibTorch to split
// across cores: with intra-op threads one core works and the others wait (the HiDream demo's
// transformer stage ran at half the machine). Shards with one intra-op thread each keep every
// core busy. Holds the process at one intra-op thread while alive.
class DataParallelGradients {
 public:
  // `shards` threads at most (at least 1).
  explicit DataParallelGradients(int shards);

  int shards() const { return shards_; }

  // Runs shard_loss(k) for every shard k on its own thread (it must build its own graph; any
  // autocast state is the shard's to set) and sets each parameter's gradient to the sum of the
  // shards' gradients of their losses, added in shard order so that a run repeats bit for bit
  // whatever the threads' timing. Returns the sum of the losses. A shard's exception is
  // rethrown here after every thread has ended.
  double backward(const std::vector<torch::Tensor>& params,
                  const std::function<torch::Tensor(int shard)>& shard_loss);

 private:
  int shards_;
  device::ScopedCpuThreads one_thread_each_;
};

// The share of `total` items that shard `k` of `shards` takes (the first ones take one more
// when it does not divide), and where that share starts.
int64_t shard_size(int64_t total, int shards, int k);
int64_t shard_begin(int64_t total, int shards, int k);

}  // namespace diffuse::train
