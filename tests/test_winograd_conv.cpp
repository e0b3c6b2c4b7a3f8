// Float32 3x3 convolutions by Winograd's F(2x2, 3x3) and F(4x4, 3x3) (nn/winograd_conv.h): within
// what float32 Winograd arithmetic can do against a float64 reference on every shape (odd
// sizes, one pixel, several passes over the tiles), taken by nn::Conv2d exactly where it
// applies, and clear errors for inputs it cannot take.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "diffuse/errors.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/winograd_conv.h"

using namespace diffuse;

namespace test_winograd_conv {

torch::Tensor randn(c10::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, gen, torch::kFloat32);
}

double max_abs(const torch::Tensor& t) {
  return t.numel() ? t.abs().max().item<double>() : 0.0;
}

// Restores the process-wide switches a test changes.
struct Switches {
  ~Switches() {
    nn::set_winograd_enabled(true);
    nn::set_default_attention_backend(nn::AttentionBackend::kAuto);
  }
};

// The published transforms (Lavin & Gray) of F(m x m, 3x3) in float64: B^T (n x n), G (n x 3)
// and A^T (m x n), n = m + 2.
struct Transforms {
  torch::Tensor BT, G, AT;
};

Transforms transforms(int64_t m) {
  auto mat = [](std::vector<double> v, int64_t rows, int64_t cols) {
    return torch::tensor(v, torch::kFloat64).reshape({rows, cols});
  };
  if (m == 2)
    return {mat({1, 0, -1, 0, 0, 1, 1, 0, 0, -1, 1, 0, 0, 1, 0, -1}, 4, 4),
            mat({1, 0, 0, .5, .5, .5, .5, -.5, .5, 0, 0, 1}, 4, 3),
            mat({1, 1, 1, 0, 0, 1, -1, -1}, 2, 4)};
  return {mat({4, 0,  -5, 0, 1, 0, 0, -4, -4, 1,  1, 0, 0, 4, -4, -1, 1, 0,
               0, -2, -1, 2, 1, 0, 0, 2,  -1, -2, 1, 0, 0, 4, 0,  -5, 0, 1},
              6, 6),
          mat({1. / 4, 0, 0, -1. / 6, -1. / 6, -1. / 6, -1. / 6, 1. / 6, -1. / 6, 1. / 24, 1. / 12,
               1. / 6, 1. / 24, -1. / 12, 1. / 6, 0, 0, 1},
              6, 3),
          mat({1, 1, 1, 1, 1, 0, 0, 1, -1, 2, -2, 0, 0, 1, 1, 4, 4, 0, 0, 1, -1, 8, -8, 1}, 4, 6)};
}

// F(m x m, 3x3) in float64, padding 1, no bias. With `absolute`, every matrix and operand by
// its absolute value: the magnitude that Winograd's float32 rounding errors are relative to.
enum class Magnitude { kExact, kAbsolute, kSquared };
torch::Tensor winograd_f64(const torch::Tensor& x, const torch::Tensor& w, int64_t m,
                           Magnitude mode) {
  auto t = transforms(m);
  auto a = [&](const torch::Tensor& v) {
    return mode == Magnitude::kExact ? v : mode == Magnitude::kAbsolute ? v.abs() : v.square();
  };
  const int64_t n = m + 2, H = x.size(2), W = x.size(3);
  const int64_t th = (H + m - 1) / m, tw = (W + m - 1) / m;
  auto xp =
      torch::constant_pad_nd(a(x.to(torch::kFloat64)), {1, tw * m + 1 - W, 1, th * m + 1 - H});
  auto patches = xp.unfold(2, n, m).unfold(3, n, m);  // [B, C, th, tw, n, n]
  auto V = torch::einsum("ij,bcxyjk,lk->bcxyil", {a(t.BT), patches, a(t.BT)});
  auto U = torch::einsum("ij,ocjk,lk->ocil", {a(t.G), a(w.to(torch::kFloat64)), a(t.G)});
  auto M = torch::einsum("ocil,bcxyil->boxyil", {U, V});
  auto Y = torch::einsum("ij,boxyjk,lk->boxyil", {a(t.AT), M, a(t.AT)});  // [B, O, th, tw, m, m]
  return Y.permute({0, 1, 2, 4, 3, 5})
      .reshape({x.size(0), w.size(0), th * m, tw * m})
      .narrow(2, 0, H)
      .narrow(3, 0, W);
}

TEST(WinogradConv, WithinFloat32WinogradArithmeticsErrorBoundOnEveryShape) {
  torch::NoGradGuard no_grad;
  struct Shape {
    int64_t B, C, O, H, W;
    bool bias;
  };
  const double u = std::ldexp(1.0, -24);  // float32 unit roundoff
  // Odd and even sizes (a half-filled last tile), one pixel, one channel, channel counts that
  // are no multiple of a vector, several images.
  for (const Shape& s :
       {Shape{1, 3, 5, 1, 1, true}, Shape{2, 7, 5, 9, 9, false}, Shape{1, 32, 48, 8, 6, true},
        Shape{3, 64, 32, 5, 12, true}, Shape{2, 40, 40, 17, 3, false}, Shape{1, 1, 1, 2, 7, true},
        Shape{2, 130, 67, 16, 16, true}}) {
    SCOPED_TRACE(::testing::Message()
                 << s.B << "x" << s.C << "->" << s.O << " @" << s.H << "x" << s.W);
    const auto x = randn({s.B, s.C, s.H, s.W}, 1);
    const auto w = randn({s.O, s.C, 3, 3}, 2) * 0.1;
    const auto b = s.bias ? randn({s.O}, 3) : torch::Tensor();
    const auto bias64 = s.bias ? b.to(torch::kDouble).reshape({1, -1, 1, 1})
                               : torch::zeros({1, s.O, 1, 1}, torch::kDouble);
    const auto reference =
        torch::conv2d(x.to(torch::kDouble), w.to(torch::kDouble), torch::Tensor(), 1, 1) + bias64;
    for (int64_t tile : {2, 4}) {
      SCOPED_TRACE(::testing::Message() << "F(" << tile << "x" << tile << ", 3x3)");
      // The float64 transforms are right: the same result as the direct convolution.
      const auto exact = winograd_f64(x, w, tile, Magnitude::kExact) + bias64;
      ASSERT_LE(max_abs(exact - reference), 1e-10 * (1 + max_abs(reference)));
      // Bounds from what float32 Winograd arithmetic can do on this input (so they hold on
      // every CPU, whatever order its BLAS sums in), with k the longest chain of roundings: the
      // input transform's two passes of n terms, the weight transform's two passes of 3 (its
      // coefficients rounded too), the product, the sum over C channels, the output
      // transform's two passes of n terms and the bias.
      const int64_t n = tile + 2, k = s.C + 4 * n + 6 + 3 + 2;
      const auto wino = nn::winograd_conv3x3(x, w, b, tile);
      ASSERT_EQ(wino.sizes(), reference.sizes());
      EXPECT_EQ(wino.scalar_type(), torch::kFloat32);
      const auto err = (wino.to(torch::kDouble) - reference).abs();
      const auto bias_rounding = 2 * u * reference.abs();
      // Worst case (rigorous): gamma_k times the absolute magnitude
      // |A^T| [sum_c (|G| |g| |G^T|) .* (|B^T| |d| |B|)] |A|.
      const double gamma = k * u / (1 - k * u);
      const auto worst = gamma * winograd_f64(x, w, tile, Magnitude::kAbsolute) + bias_rounding;
      EXPECT_TRUE((err <= worst).all().item<bool>())
          << "error / worst-case bound " << (err / worst).max().item<double>();
      // Probabilistic (Higham & Mary: independent roundings add up as a random walk):
      // lambda sqrt(k) u times the root of the squared magnitudes. Measured on two CPUs: at most
      // 1.7x sqrt(k) u R (F(4x4), 130 channels); lambda = 8 leaves 4.7x, and the bound stays far
      // below a whole wrong term (|x| |w| ~ 0.08: a wrong tile, sign or padding).
      const double lambda = 8;
      const auto likely = lambda * std::sqrt(static_cast<double>(k)) * u *
                              winograd_f64(x, w, tile, Magnitude::kSquared).sqrt() +
                          bias_rounding;
      EXPECT_TRUE((err <= likely).all().item<bool>())
          << "error / probabilistic bound " << (err / likely).max().item<double>() << ", max error "
          << max_abs(err);
      EXPECT_LT(likely.max().item<double>(), 0.01);
    }
  }
}

TEST(WinogradConv, ImagesLargerThanOnePassRunInSeveralPasses) {
  torch::NoGradGuard no_grad;
  // 16 * (C + O) floats per tile: 2 x 150 tile rows of 64 tiles at 32 + 32 channels are
  // ~75 MiB of transformed tiles, more than one pass holds, and a pass boundary falls inside
  // the second image.
  const auto x = randn({2, 32, 300, 128}, 4);
  const auto w = randn({32, 32, 3, 3}, 5) * 0.1;
  const auto b = randn({32}, 6);
  const auto direct = torch::conv2d(x, w, b, 1, 1);
  for (int64_t tile : {2, 4}) {
    const auto wino = nn::winograd_conv3x3(x, w, b, tile);
    EXPECT_LE(max_abs(wino - direct), 1e-4 * (1.0 + max_abs(direct))) << "F(" << tile << ")";
  }
}

TEST(WinogradConv, AppliesOnlyWhereItIsRightAndPays) {
  Switches restore;
  torch::NoGradGuard no_grad;
  const auto x = randn({2, 512, 32, 32}, 7);
  const auto w = randn({512, 512, 3, 3}, 8);
  const std::vector<int64_t> one{1, 1}, two{2, 2}, zero{0, 0};
  EXPECT_TRUE(nn::winograd_conv_applies(x, w, one, one, one, 1));
  EXPECT_TRUE(nn::winograd_conv_applies(x, w.to(torch::kHalf), one, one, one, 1))
      << "a 16-bit weight is widened for the call";
  EXPECT_FALSE(nn::winograd_conv_applies(x, w, two, one, one, 1)) << "stride 2";
  EXPECT_FALSE(nn::winograd_conv_applies(x, w, one, zero, one, 1)) << "no padding";
  EXPECT_FALSE(nn::winograd_conv_applies(x, w, one, one, two, 1)) << "dilation 2";
  EXPECT_FALSE(nn::winograd_conv_applies(x, w.narrow(1, 0, 32), one, one, one, 2)) << "groups";
  EXPECT_FALSE(nn::winograd_conv_applies(x.to(torch::kBFloat16), w, one, one, one, 1)) << "bf16";
  EXPECT_FALSE(nn::winograd_conv_applies(x.contiguous(torch::MemoryFormat::ChannelsLast), w, one,
                                         one, one, 1))
      << "channels-last";
  EXPECT_FALSE(nn::winograd_conv_applies(x, randn({64, 64, 1, 1}, 9), one, zero, one, 1)) << "1x1";
  EXPECT_FALSE(nn::winograd_conv_applies(x.narrow(2, 0, 8).narrow(3, 0, 8).contiguous(), w, one,
                                         one, one, 1))
      << "32 tiles: too few for the products to pay";
  EXPECT_FALSE(nn::winograd_conv_applies(x.narrow(1, 0, 64).contiguous(),
                                         w.narrow(0, 0, 64).narrow(1, 0, 64), one, one, one, 1))
      << "64 channels: products too small to pay";
  EXPECT_FALSE(nn::winograd_conv_applies(x.narrow(1, 0, 8).contiguous(), w.narrow(1, 0, 8), one,
                                         one, one, 1))
      << "8 input channels";
  EXPECT_FALSE(nn::winograd_conv_applies(x.narrow(2, 0, 1).contiguous(), w, one, one, one, 1))
      << "one output row";
  {
    torch::AutoGradMode grad(true);
    EXPECT_FALSE(nn::winograd_conv_applies(x, w.clone().requires_grad_(), one, one, one, 1))
        << "autograd records the weight";
  }
  nn::set_default_attention_backend(nn::AttentionBackend::kMath);
  EXPECT_FALSE(nn::winograd_conv_applies(x, w, one, one, one, 1)) << "the reference path";
  nn::set_default_attention_backend(nn::AttentionBackend::kAuto);
  nn::set_winograd_enabled(false);
  EXPECT_FALSE(nn::winograd_conv_applies(x, w, one, one, one, 1)) << "switched off";
}

TEST(WinogradConv, Conv2dLayerTakesItWithAFloat16WeightAndMatchesTheDirectPath) {
  Switches restore;
  torch::NoGradGuard no_grad;
  torch::manual_seed(10);
  auto conv = nn::make_conv2d(torch::nn::Conv2dOptions(384, 384, 3).padding(1));
  conv->weight.set_data(conv->weight.to(torch::kHalf));  // kept 16-bit, as a float16 model file
  const auto x = randn({2, 384, 16, 16}, 11);
  const auto wino = conv->forward(x);
  nn::set_winograd_enabled(false);
  const auto direct = conv->forward(x);
  ASSERT_EQ(wino.sizes(), direct.sizes());
  const double diff = max_abs(wino - direct);
  EXPECT_GT(diff, 0.0) << "the layer did not take the Winograd path";
  EXPECT_LE(diff, 1e-4 * (1.0 + max_abs(direct)));
}

TEST(WinogradConv, InputsItCannotTakeAreRefusedWithTheirShapes) {
  const auto x = randn({1, 8, 6, 6}, 12);
  const auto w = randn({4, 8, 3, 3}, 13);
  auto expect_refused = [](const std::function<void()>& call, const std::string& mention) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected a refusal mentioning " << mention;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { nn::winograd_conv3x3(x.to(torch::kBFloat16), w, {}); }, "BFloat16");
  expect_refused([&] { nn::winograd_conv3x3(x, randn({4, 8, 5, 5}, 14), {}); }, "[4, 8, 5, 5]");
  expect_refused([&] { nn::winograd_conv3x3(x, randn({4, 3, 3, 3}, 15), {}); }, "[4, 3, 3, 3]");
  expect_refused([&] { nn::winograd_conv3x3(x.view({8, 6, 6}), w, {}); }, "[8, 6, 6]");
  expect_refused([&] { nn::winograd_conv3x3(x, w, randn({5}, 16)); }, "5 values for 4");
  expect_refused([&] { nn::winograd_conv3x3(x, w, {}, 3); }, "output tile 3");
}

}  // namespace test_winograd_conv
