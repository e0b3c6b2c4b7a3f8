#include "train/data_parallel.h"

#include <algorithm>
#include <exception>
#include <thread>

namespace diffuse::train {

DataParallelGradients::DataParallelGradients(int shards)
    : shards_(std::max(1, shards)), one_thread_each_(1) {}

double DataParallelGradients::backward(const std::vector<torch::Tensor>& params,
                                       const std::function<torch::Tensor(int)>& shard_loss) {
  std::vector<std::vector<torch::Tensor>> grads(shards_);
  std::vector<double> losses(shards_, 0.0);
  std::vector<std::exception_ptr> errors(shards_);
  auto run = [&](int k) {
    try {
      const auto loss = shard_loss(k);
      // Unused parameters (experts no token was routed to) get no gradient.
      grads[k] = torch::autograd::grad({loss}, params, /*grad_outputs=*/{},
                                       /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
      losses[k] = loss.item<double>();
    } catch (...) {
      errors[k] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int k = 1; k < shards_; ++k) threads.emplace_back(run, k);
  run(0);
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);

  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor sum;
    for (int k = 0; k < shards_; ++k) {
      const auto& g = grads[k][i];
      if (!g.defined()) continue;
      sum = sum.defined() ? sum + g : g.clone();
    }
    auto& grad = params[i].mutable_grad();
    grad = sum.defined() ? sum : torch::zeros_like(params[i]);
  }
  double total = 0;
  for (double l : losses) total += l;
  return total;
}

int64_t shard_size(int64_t total, int shards, int k) {
  return total / shards + (k < total % shards ? 1 : 0);
}

int64_t shard_begin(int64_t total, int shards, int k) {
  int64_t begin = 0;
  for (int j = 0; j < k; ++j) begin += shard_size(total, shards, j);
  return begin;
}

}  // namespace diffuse::train
