// Data-parallel shards of a training step (train/data_parallel.h): the gradients are the whole
// batch's, the same bit for bit from run to run, and a shard's failure reaches the caller.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <stdexcept>

#include "train/data_parallel.h"

namespace diffuse {
namespace test_data_parallel {

// A two-layer network's squared error on rows [begin, begin + n) of (x, y), as a share of the
// whole batch's mean.
torch::Tensor loss_of(const torch::Tensor& w1, const torch::Tensor& w2, const torch::Tensor& x,
                      const torch::Tensor& y, int64_t begin, int64_t n) {
  const auto h = torch::tanh(x.narrow(0, begin, n).matmul(w1));
  const auto err = (h.matmul(w2) - y.narrow(0, begin, n)).pow(2).sum();
  return err / static_cast<double>(x.size(0) * y.size(1));
}

struct Problem {
  torch::Tensor w1, w2, x, y;
  explicit Problem(torch::ScalarType dtype) {
    torch::manual_seed(7);
    w1 = torch::randn({5, 8}).to(dtype).requires_grad_();
    w2 = torch::randn({8, 3}).to(dtype).requires_grad_();
    x = torch::randn({7, 5}).to(dtype);
    y = torch::randn({7, 3}).to(dtype);
  }
};

std::vector<torch::Tensor> sharded_gradients(int shards) {
  Problem p(torch::kFloat32);
  train::DataParallelGradients parallel(shards);
  const int S = parallel.shards();
  const int64_t N = p.x.size(0);
  parallel.backward({p.w1, p.w2}, [&](int k) {
    return loss_of(p.w1, p.w2, p.x, p.y, train::shard_begin(N, S, k), train::shard_size(N, S, k));
  });
  return {p.w1.grad(), p.w2.grad()};
}

TEST(DataParallel, ShardsCoverTheBatchOnce) {
  for (int64_t total : {1, 2, 7, 36}) {
    for (int shards : {1, 2, 3, 4}) {
      if (shards > total) continue;
      int64_t next = 0;
      for (int k = 0; k < shards; ++k) {
        EXPECT_EQ(train::shard_begin(total, shards, k), next);
        EXPECT_GE(train::shard_size(total, shards, k), total / shards);
        next += train::shard_size(total, shards, k);
      }
      EXPECT_EQ(next, total) << total << " items in " << shards << " shards";
    }
  }
}

TEST(DataParallel, GradientsAreTheWholeBatchs) {
  // Reference: the whole batch in float64, and per-row gradient magnitudes for the bound (a sum
  // of 7 float32 terms is off by at most ~7 eps of the sum of their magnitudes, with room).
  Problem ref(torch::kFloat64);
  loss_of(ref.w1, ref.w2, ref.x, ref.y, 0, ref.x.size(0)).backward();
  std::vector<torch::Tensor> magnitude = {torch::zeros_like(ref.w1), torch::zeros_like(ref.w2)};
  for (int64_t r = 0; r < ref.x.size(0); ++r) {
    Problem row(torch::kFloat64);
    loss_of(row.w1, row.w2, row.x, row.y, r, 1).backward();
    magnitude[0] += row.w1.grad().abs();
    magnitude[1] += row.w2.grad().abs();
  }
  const double eps = std::numeric_limits<float>::epsilon();
  for (int shards : {1, 2, 3}) {
    const auto g = sharded_gradients(shards);
    const std::vector<torch::Tensor> want = {ref.w1.grad(), ref.w2.grad()};
    for (size_t i = 0; i < g.size(); ++i) {
      const auto err = (g[i].to(torch::kFloat64) - want[i]).abs();
      const auto bound = 64 * eps * (magnitude[i] + want[i].abs()) + 1e-30;
      EXPECT_TRUE((err <= bound).all().item<bool>())
          << shards << " shards, parameter " << i << ": worst error "
          << (err - bound).max().item<double>() << " over the bound";
    }
  }
}

TEST(DataParallel, RepeatsBitForBit) {
  for (int shards : {2, 3}) {
    const auto a = sharded_gradients(shards), b = sharded_gradients(shards);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << shards;
  }
}

TEST(DataParallel, UnusedParameterGetsAZeroGradient) {
  Problem p(torch::kFloat32);
  auto unused = torch::ones({2}).requires_grad_();
  train::DataParallelGradients parallel(2);
  const double loss = parallel.backward({p.w1, p.w2, unused}, [&](int k) {
    return loss_of(p.w1, p.w2, p.x, p.y, train::shard_begin(7, parallel.shards(), k),
                   train::shard_size(7, parallel.shards(), k));
  });
  EXPECT_GT(loss, 0.0);
  ASSERT_TRUE(unused.grad().defined());
  EXPECT_TRUE(torch::equal(unused.grad(), torch::zeros({2})));
}

TEST(DataParallel, AShardsErrorReachesTheCaller) {
  Problem p(torch::kFloat32);
  train::DataParallelGradients parallel(2);
  EXPECT_THROW(parallel.backward({p.w1, p.w2},
                                 [&](int k) -> torch::Tensor {
                                   if (k == 1) throw std::runtime_error("shard 1 failed");
                                   return loss_of(p.w1, p.w2, p.x, p.y, 0, 3);
                                 }),
               std::runtime_error);
}

}  // namespace test_data_parallel
}  // namespace diffuse
