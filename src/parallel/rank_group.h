// A group of processes (ranks), one per device, that run one generation together and exchange
// tensors: CFG-parallel (each computes some guidance branches, src/parallel/branch_split.h) and
// Ulysses sequence parallelism (each holds some image tokens, src/parallel/ulysses.h). This is
// the group seen from one rank; the pipelines and the DiT blocks use it when set.
#pragma once
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::parallel {

class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's device: what the backend exchanges tensors on.
  virtual torch::Device device() const = 0;
  // Every rank's `mine` (the same shape and dtype on all ranks), in rank order, on `mine`'s
  // device. `what` names the exchange in errors ("noise predictions"). Throws diffuse::Error
  // naming the backend, the exchange and the timeout when a peer is gone or stays silent past
  // the timeout: the caller never blocks forever.
  virtual std::vector<torch::Tensor> all_gather(const torch::Tensor& mine,
                                                const std::string& what = "noise predictions") = 0;
  // All-to-all over one-dimensional tensors: `send` holds send_counts[r] elements for rank r,
  // in rank order; the result holds recv_counts[r] elements from rank r, in rank order (every
  // rank's send_counts[me] must equal my recv_counts[that rank]). Any dtype: the bytes move
  // as they are. Errors as all_gather.
  virtual torch::Tensor all_to_all(const torch::Tensor& send,
                                   const std::vector<int64_t>& send_counts,
                                   const std::vector<int64_t>& recv_counts,
                                   const std::string& what) = 0;
  // Notices outside the collectives, through the store the ranks met at: for ranks that idle
  // between runs (a server's ranks wait for its next job as long as it takes; no collective
  // timeout applies). Keys live apart from the group's own.
  virtual void post(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` is posted and returns its value; a zero `timeout` waits as long as it
  // takes. Throws diffuse::Error naming the key when the store is gone (the rank serving it
  // died) or the timeout passed.
  virtual std::string wait_post(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds `delta` to the counter `key` (0 when new) and returns the sum: every rank sees each
  // addition once.
  virtual int64_t add_post(const std::string& key, int64_t delta) = 0;
  // Removes a posted key where the store can (FileStore cannot: its keys stay, a few bytes each).
  virtual void drop_post(const std::string& key) = 0;
  // Bytes this rank has sent to the others so far (traffic, for `diffuse bench parallel`).
  virtual int64_t bytes_sent() const = 0;
  // "gloo, rank 0 of 2" (messages and logs).
  virtual std::string describe() const = 0;
};

}  // namespace diffuse::parallel
