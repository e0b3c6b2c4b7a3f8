// Int8 convolutions (`--weights int8` on a convolution, nn/int8_conv.h): each output pixel's
// receptive field quantized on its own, the integer product within what its two roundings allow
// of the plain float64 convolution, for strides, paddings, 1x1 and 3x3 kernels, both dtypes and
// more pixels than one GEMM call takes; the layer takes it or dequantizes, as chosen.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "diffuse/errors.h"
#include "nn/int8_conv.h"
#include "nn/int8_linear.h"
#include "nn/layers.h"
#include "quant/quantized_weight.h"
#include "test_util.h"

namespace diffuse {
namespace test_int8_conv {

using quant::GgmlType;

// The linear layer's bound with each pixel's receptive field (unfold, the weight's (c, ky, kx)
// order) as its input row: per output sum_k |x_k| sw/2 + |w'_k| sx/2 + sx sw/4, plus the
// float32 epilogue's roundings and, for bf16 outputs, one rounding to bf16.
void expect_within_bound(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                         const nn::ConvGeometry& g, const torch::Tensor& y,
                         const quant::QuantizedWeight& q) {
  namespace F = torch::nn::functional;
  const auto xd = x.to(torch::kDouble), wd = w.to(torch::kDouble);
  const auto exact =
      torch::conv2d(xd, wd, bias.to(torch::kDouble), {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w});
  // [N, K, pixels] -> [N * pixels, K]
  auto cols = F::unfold(xd, F::UnfoldFuncOptions({g.kernel_h, g.kernel_w})
                                .padding({g.pad_h, g.pad_w})
                                .stride({g.stride_h, g.stride_w}));
  cols = cols.transpose(1, 2).reshape({-1, cols.size(1)});
  const auto sx = cols.abs().amax(-1, true) / 127.0;
  const auto sw = q.row_scales.to(torch::kDouble).unsqueeze(0);
  const auto wq = quant::dequantize_weight(q, torch::kDouble);
  const auto ones_w = torch::ones_like(wq);
  const auto bound = torch::matmul(cols.abs(), ones_w.t()) * sw * 0.5 +
                     torch::matmul(torch::ones_like(cols), wq.abs().t()) * sx * 0.5 +
                     sx * sw * (0.25 * static_cast<double>(cols.size(1)));
  // exact as [N * pixels, O], the rows in the same order
  const auto ex = exact.permute({0, 2, 3, 1}).reshape({-1, exact.size(1)});
  const auto got = y.to(torch::kDouble).permute({0, 2, 3, 1}).reshape({-1, exact.size(1)});
  const double out_ulp = y.scalar_type() == torch::kBFloat16 ? 1.0 / 256 : 0;
  const auto slack = (ex.abs() + bound) * out_ulp + 1e-6 * (bound + ex.abs() + 1);
  const auto err = (got - ex).abs();
  EXPECT_TRUE(err.le(bound + slack).all().item<bool>())
      << "largest excess " << (err - bound - slack).max().item<double>();
  // The roundings' errors cancel in part: far inside the worst case.
  EXPECT_LT(err.max().item<double>(), 0.5 * bound.max().item<double>() + 1e-3);
}

TEST(Int8Conv, ConvolutionWithinTheBoundOfItsRoundings) {
  if (!nn::int8_gemm_available()) GTEST_SKIP() << "no oneDNN integer GEMM or no AVX512-VNNI here";
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(7);
  struct Case {
    int64_t n, c, h, w, o, k, stride, pad;
  };
  // The last one: 2 x 40 x 30 = 2400 output pixels, three GEMM calls of the pixel chunks.
  for (const Case& t : {Case{1, 32, 9, 7, 16, 3, 1, 1}, Case{2, 32, 10, 9, 24, 3, 2, 1},
                        Case{1, 64, 5, 6, 8, 1, 1, 0}, Case{2, 32, 40, 30, 16, 3, 1, 1},
                        Case{1, 32, 6, 6, 8, 3, 1, 0}}) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      const auto x = (torch::randn({t.n, t.c, t.h, t.w}, gen, torch::kFloat) * 2).to(dtype);
      const auto w = torch::randn({t.o, t.c, t.k, t.k}, gen, torch::kFloat) * 0.1;
      const auto bias = torch::randn({t.o}, gen, torch::kFloat);
      const auto q = quant::quantize_weight(w.reshape({t.o, -1}), GgmlType::I8_ROWS, "w");
      nn::ConvGeometry g;
      g.kernel_h = g.kernel_w = t.k;
      g.stride_h = g.stride_w = t.stride;
      g.pad_h = g.pad_w = t.pad;
      ASSERT_TRUE(nn::int8_conv2d_runs(x, q, g));
      const auto y = nn::int8_conv2d(x, q, g, bias.to(dtype));
      ASSERT_EQ(y.scalar_type(), dtype);
      EXPECT_TRUE(y.is_contiguous(torch::MemoryFormat::ChannelsLast));
      SCOPED_TRACE(c10::str(x.sizes(), " kernel ", t.k, " stride ", t.stride, " ", dtype));
      expect_within_bound(x.to(torch::kFloat), w, bias.to(dtype).to(torch::kFloat), g, y, q);
    }
  }
  // What it does not take: groups, dilation, another width, float64; a bad bias.
  const auto q = quant::quantize_weight(torch::randn({8, 16 * 9}), GgmlType::I8_ROWS, "w");
  nn::ConvGeometry g;
  g.kernel_h = g.kernel_w = 3;
  const auto x = torch::randn({1, 16, 5, 5});
  EXPECT_TRUE(nn::int8_conv2d_runs(x, q, g));
  auto g2 = g;
  g2.groups = 2;
  EXPECT_FALSE(nn::int8_conv2d_runs(x, q, g2));
  g2 = g;
  g2.dilation_h = 2;
  EXPECT_FALSE(nn::int8_conv2d_runs(x, q, g2));
  EXPECT_FALSE(nn::int8_conv2d_runs(torch::randn({1, 15, 5, 5}), q, g));
  EXPECT_FALSE(nn::int8_conv2d_runs(x.to(torch::kDouble), q, g));
  EXPECT_THROW(nn::int8_conv2d(x, q, g, torch::randn({7})), InvalidArgument);
  EXPECT_THROW(nn::int8_conv2d(torch::randn({1, 16, 1, 1}), q, g, {}), InvalidArgument);
  EXPECT_THROW(nn::int8_conv2d(x.to(torch::kDouble), q, g, {}), InvalidArgument);
}

// A quantized Conv2d layer: the integer product where chosen (float32 inputs on a VNNI CPU),
// else its dequantized weight; the same values within the bound either way.
TEST(Int8Conv, LayerConvolvesInIntegersOrDequantizes) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(8);
  nn::Conv2d conv(nn::make_conv2d(torch::nn::Conv2dOptions(32, 16, 3).padding(1)));
  const auto w = conv->weight.detach().clone();
  const auto b = conv->bias.detach().clone();
  const auto layers = nn::quantize_conv_layers(*conv, GgmlType::I8_ROWS);
  ASSERT_EQ(layers.layers, 1);
  ASSERT_TRUE(conv->quantized);
  const auto x = torch::randn({2, 32, 8, 8});
  nn::ConvGeometry g;
  g.kernel_h = g.kernel_w = 3;
  g.pad_h = g.pad_w = 1;
  const auto y = conv->forward(x);
  ASSERT_EQ(y.sizes().vec(), (std::vector<int64_t>{2, 16, 8, 8}));
  if (nn::int8_conv2d_chosen(x, *conv->quantized, g)) {
    EXPECT_TRUE(torch::equal(y, nn::int8_conv2d(x, *conv->quantized, g, b)));
    expect_within_bound(x, w, b, g, y, *conv->quantized);
  }
  // float64 never takes it: the dequantized weight, exactly.
  conv->to(torch::kDouble);  // the bias; the blocks stay
  const auto xd = x.to(torch::kDouble);
  const auto want =
      torch::conv2d(xd, quant::dequantize_weight(*conv->quantized, torch::kDouble).view(w.sizes()),
                    b.to(torch::kDouble), 1, 1);
  EXPECT_TRUE(torch::allclose(conv->forward(xd), want, 1e-12, 1e-12));
}

}  // namespace test_int8_conv
}  // namespace diffuse
