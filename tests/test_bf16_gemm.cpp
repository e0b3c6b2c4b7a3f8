// Our AVX512-BF16 linear-layer product (nn/cpu_bf16_linear.h) against a float64 evaluation of
// the same bf16 inputs, bounded by what its arithmetic can do: one bf16 rounding of the result
// and the float32 sum's error (K * 2^-24 * sum |x||w|). Shapes cover every tile edge (rows
// around the 6-row tile, outputs around the 4-output tile, K around the 32-value load).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "nn/cpu_bf16_linear.h"
#include "nn/layers.h"
#include "cpu_bf16.h"

using namespace diffuse;

namespace test_bf16_gemm {

// Sets the policy for one test and restores the one before.
struct ScopedPolicy {
  explicit ScopedPolicy(nn::Bf16GemmPolicy p) { nn::set_bf16_gemm_policy(p); }
  ~ScopedPolicy() { nn::set_bf16_gemm_policy(saved); }
  nn::Bf16GemmPolicy saved = nn::bf16_gemm_policy();
};

bool kernel_here() {
  ScopedPolicy own(nn::Bf16GemmPolicy::own);
  return nn::own_bf16_gemm_applies(1);
}

torch::Tensor bf16_randn(c10::IntArrayRef shape, uint64_t seed, double scale = 1) {
  auto gen = at::detail::createCPUGenerator(seed);
  return (torch::randn(shape, gen, torch::kFloat32) * scale).to(torch::kBFloat16);
}

// y within one bf16 rounding of the float64 result plus float32 summation error.
void expect_within_arithmetic(const torch::Tensor& y, const torch::Tensor& x,
                              const torch::Tensor& w, const torch::Tensor& b,
                              const torch::Tensor& r, const std::string& what) {
  const auto xd = x.to(torch::kFloat64).reshape({-1, w.size(1)}), wd = w.to(torch::kFloat64);
  auto ref = torch::mm(xd, wd.t());
  auto abs_sum = torch::mm(xd.abs(), wd.abs().t());
  if (b.defined()) {
    ref = ref + b.to(torch::kFloat64);
    abs_sum = abs_sum + b.to(torch::kFloat64).abs();
  }
  if (r.defined()) {
    const auto rd = r.to(torch::kFloat64).reshape(ref.sizes());
    ref = ref + rd;
    abs_sum = abs_sum + rd.abs();
  }
  const double K = static_cast<double>(w.size(1)) + 2;
  const auto bound = ref.abs() * std::ldexp(1.0, -8) + abs_sum * (K * std::ldexp(1.0, -24));
  const auto err = (y.to(torch::kFloat64).reshape(ref.sizes()) - ref).abs();
  EXPECT_LE((err - bound).max().item<double>(), 0.0)
      << what << ": max error " << err.max().item<double>();
}

TEST(Bf16Gemm, EveryTileEdgeWithinBf16Rounding) {
  if (!kernel_here()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  ScopedPolicy own(nn::Bf16GemmPolicy::own);
  torch::NoGradGuard no_grad;
  uint64_t seed = 1;
  for (int64_t m : {1, 5, 6, 7, 13, 77}) {
    for (int64_t n : {1, 3, 4, 5, 17, 40}) {
      for (int64_t k : {1, 31, 32, 33, 100, 1024}) {
        const auto x = bf16_randn({m, k}, ++seed), w = bf16_randn({n, k}, ++seed, 0.1);
        const auto b = bf16_randn({n}, ++seed), r = bf16_randn({m, n}, ++seed);
        const std::string shape =
            std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
        auto y = nn::cpu_bf16_linear(x, w);
        ASSERT_TRUE(y.defined()) << shape;
        ASSERT_EQ(y.sizes(), (std::vector<int64_t>{m, n}));
        EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
        expect_within_arithmetic(y, x, w, {}, {}, shape);
        expect_within_arithmetic(nn::cpu_bf16_linear(x, w, b), x, w, b, {}, shape + " + bias");
        expect_within_arithmetic(nn::cpu_bf16_linear(x, w, b, r), x, w, b, r,
                                 shape + " + bias + residual");
      }
    }
  }
}

TEST(Bf16Gemm, BatchedInputKeepsItsLeadingDimensions) {
  if (!kernel_here()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  ScopedPolicy own(nn::Bf16GemmPolicy::own);
  torch::NoGradGuard no_grad;
  const auto x = bf16_randn({2, 77, 64}, 3), w = bf16_randn({48, 64}, 4, 0.2);
  const auto b = bf16_randn({48}, 5);
  const auto y = nn::cpu_bf16_linear(x, w, b);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 77, 48}));
  expect_within_arithmetic(y, x, w, b, {}, "2x77x64 @ 48");
}

TEST(Bf16Gemm, NotANumberAndInfinityPropagate) {
  if (!kernel_here()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  ScopedPolicy own(nn::Bf16GemmPolicy::own);
  torch::NoGradGuard no_grad;
  auto x = torch::ones({7, 40}, torch::kBFloat16);
  auto w = torch::ones({9, 40}, torch::kBFloat16);
  x[2][5] = std::numeric_limits<float>::quiet_NaN();
  x[4][39] = std::numeric_limits<float>::infinity();
  const auto y = nn::cpu_bf16_linear(x, w).to(torch::kFloat32);
  EXPECT_TRUE(torch::isnan(y[2]).all().item<bool>());
  EXPECT_TRUE(torch::isinf(y[4]).all().item<bool>());
  EXPECT_TRUE((y[0] == 40).all().item<bool>());
}

TEST(Bf16Gemm, TakesOnlyWhatItCanAndTheLayersAgreeEitherWay) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  torch::NoGradGuard no_grad;
  const auto x = bf16_randn({2, 11, 64}, 6);
  const auto w = bf16_randn({24, 64}, 7, 0.2);
  {
    ScopedPolicy own(nn::Bf16GemmPolicy::own);
    // float32, a non-contiguous weight or input, a shape mismatch: LibTorch's path.
    EXPECT_FALSE(nn::cpu_bf16_linear(x.to(torch::kFloat32), w.to(torch::kFloat32)).defined());
    EXPECT_FALSE(nn::cpu_bf16_linear(x, bf16_randn({64, 24}, 8).t()).defined());
    EXPECT_FALSE(nn::cpu_bf16_linear(x.transpose(0, 1), w).defined());
    EXPECT_FALSE(nn::cpu_bf16_linear(x, bf16_randn({24, 63}, 9)).defined());
  }
  {
    ScopedPolicy onednn(nn::Bf16GemmPolicy::onednn);
    EXPECT_FALSE(nn::own_bf16_gemm_applies(1));
    EXPECT_FALSE(nn::cpu_bf16_linear(x, w).defined());
  }
  // nn::Linear (forward, forward_add, product, with a run-time low-rank update) gives the same
  // numbers to bf16 rounding under either policy.
  nn::Linear lin = nn::make_linear(64, 24);
  lin->to(torch::kBFloat16);
  lin->low_rank.push_back({bf16_randn({4, 64}, 10, 0.1), bf16_randn({24, 4}, 11, 0.1), 0.5});
  const auto res = bf16_randn({2, 11, 24}, 12);
  torch::Tensor a[3], b[3];
  {
    ScopedPolicy own(nn::Bf16GemmPolicy::own);
    a[0] = lin->forward(x), a[1] = lin->forward_add(x, res), a[2] = lin->product(x);
  }
  {
    ScopedPolicy onednn(nn::Bf16GemmPolicy::onednn);
    b[0] = lin->forward(x), b[1] = lin->forward_add(x, res), b[2] = lin->product(x);
  }
  // Either path rounds up to three intermediates (product, low-rank sum, bias + residual) to
  // bf16, each no larger than the sum of the absolute terms.
  const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat32); };
  const auto& u = lin->low_rank[0];
  const auto terms =
      torch::matmul(f(x).abs(), f(lin->weight).abs().t()) + f(lin->bias).abs() +
      0.5 * torch::matmul(torch::matmul(f(x).abs(), f(u.down).abs().t()), f(u.up).abs().t());
  for (int i = 0; i < 3; ++i) {
    const auto all = i == 1 ? terms + f(res).abs() : terms;
    const auto d = (f(a[i]) - f(b[i])).abs();
    EXPECT_LE((d - all * (3 * std::ldexp(1.0, -8))).max().item<double>(), 0.0) << "call " << i;
  }
}

TEST(Bf16Gemm, AutogradKeepsLibTorchsPath) {
  ScopedPolicy own(nn::Bf16GemmPolicy::own);
  const auto x = bf16_randn({6, 32}, 13);
  auto w = bf16_randn({8, 32}, 14).requires_grad_(true);
  EXPECT_FALSE(nn::cpu_bf16_linear(x, w).defined());
  nn::Linear lin = nn::make_linear(32, 8);
  lin->to(torch::kBFloat16);
  auto y = lin->forward(x);
  EXPECT_TRUE(y.requires_grad());
  y.to(torch::kFloat32).sum().backward();
  EXPECT_TRUE(lin->weight.grad().defined());
}

}  // namespace test_bf16_gemm
