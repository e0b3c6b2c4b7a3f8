// CFG-parallel: the branches of one classifier-free-guidance batch (SD: negative, positive;
// HiDream-E1: unconditional, image-conditioned, fully conditioned) are computed by different
// processes, one per device, that exchange their noise predictions every step. This is the
// group they form, seen from one of them; the pipeline's denoising loop uses it when set.
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

namespace diffuse::parallel {

class CfgGroup {
 public:
  virtual ~CfgGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `mine` (the same shape and dtype on all ranks), in rank order, on `mine`'s
  // device. Throws diffuse::Error naming the backend and the timeout when a peer is gone or
  // stays silent past the timeout: the caller never blocks forever.
  virtual std::vector<torch::Tensor> all_gather(const torch::Tensor& mine) = 0;
  // "gloo, rank 0 of 2" (messages and logs).
  virtual std::string describe() const = 0;
};

}  // namespace diffuse::parallel
