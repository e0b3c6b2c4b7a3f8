// Int8 linear layers (`--weights int8`: quant::GgmlType::I8_ROWS, nn/int8_linear.h): the weight's
// rows quantize symmetrically, the activation codes round as std::nearbyint does, and the
// integer product stays within what its two roundings allow of the plain float64 product.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "diffuse/errors.h"
#include "nn/int8_linear.h"
#include "nn/kernels/cpu_features.h"
#include "nn/kernels/cpu_kernels.h"
#include "nn/layers.h"
#include "quant/ggml_blocks.h"
#include "quant/quantized_weight.h"
#include "test_util.h"

namespace diffuse {
namespace test_int8_linear {

using quant::GgmlType;

// The row quantizer's definition, one value at a time.
float reference_codes(const std::vector<float>& x, std::vector<uint8_t>& q) {
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  q.assign(x.size(), 128);
  if (amax == 0) return 0;
  const float inv = 127.0f / amax;
  for (size_t i = 0; i < x.size(); ++i)
    q[i] = static_cast<uint8_t>(static_cast<int>(std::nearbyint(x[i] * inv)) + 128);
  return amax / 127.0f;
}

TEST(Int8Linear, RowCodesRoundAsNearbyintInEveryKernelSet) {
  torch::manual_seed(1);
  for (const auto* k : nn::kernels::runnable_cpu_kernels()) {
    for (int64_t n : {1, 15, 16, 17, 100, 2560}) {
      auto xf = (torch::randn({n}) * 3).to(torch::kBFloat16).to(torch::kFloat);
      std::vector<float> x(xf.data_ptr<float>(), xf.data_ptr<float>() + n);
      std::vector<uint8_t> want, got(n), got16(n);
      const float s = reference_codes(x, want);
      EXPECT_EQ(k->f32_quantize_row_u8(x.data(), n, got.data()), s) << k->name << " n=" << n;
      EXPECT_EQ(got, want) << k->name << " n=" << n;
      const auto xb = xf.to(torch::kBFloat16);
      EXPECT_EQ(k->bf16_quantize_row_u8(reinterpret_cast<const uint16_t*>(xb.data_ptr()), n,
                                        got16.data()),
                s);
      EXPECT_EQ(got16, want) << k->name << " bf16 n=" << n;
    }
    std::vector<float> zeros(40, 0.0f), bad(40, 1.0f);
    std::vector<uint8_t> q(40);
    EXPECT_EQ(k->f32_quantize_row_u8(zeros.data(), 40, q.data()), 0.0f);
    EXPECT_EQ(q, std::vector<uint8_t>(40, 128));
    for (size_t at : {3u, 37u}) {
      bad.assign(40, 1.0f);
      bad[at] = std::numeric_limits<float>::infinity();
      EXPECT_TRUE(std::isnan(k->f32_quantize_row_u8(bad.data(), 40, q.data()))) << k->name;
      bad[at] = std::nanf("");
      EXPECT_TRUE(std::isnan(k->f32_quantize_row_u8(bad.data(), 40, q.data()))) << k->name;
    }
  }
}

TEST(Int8Linear, WeightRowsQuantizeSymmetrically) {
  torch::manual_seed(2);
  auto w = torch::randn({5, 48});
  w[3].zero_();
  const auto q = quant::quantize_weight(w, GgmlType::I8_ROWS, "w");
  EXPECT_EQ(q.bytes(), 5 * 48 + 5 * 4);
  const auto codes = q.blocks.view(torch::kChar).to(torch::kFloat);
  const auto amax = w.abs().amax(1);
  for (int64_t r = 0; r < 5; ++r) {
    EXPECT_FLOAT_EQ(q.row_scales[r].item<float>(), amax[r].item<float>() / 127.0f);
    EXPECT_EQ(codes[r].abs().max().item<float>(), r == 3 ? 0.0f : 127.0f);
  }
  const auto back = quant::dequantize_weight(q, torch::kFloat);
  const auto step = q.row_scales.unsqueeze(1);
  EXPECT_TRUE((back - w).abs().le(step * 0.5 + 1e-7).all().item<bool>());
  w[1][7] = std::numeric_limits<float>::infinity();
  for (auto type : {GgmlType::I8_ROWS, GgmlType::Q8_0}) {
    const auto msg = test::expect_throw<NumericalError>(
        [&] { quant::quantize_weight(w.narrow(1, 0, 32), type, "layer.weight"); });
    EXPECT_NE(msg.find("layer.weight"), std::string::npos) << msg;
  }
  w[1][7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(quant::quantize_weight(w, GgmlType::I8_ROWS, "w"), NumericalError);
}

TEST(Int8Linear, TheInMemoryTypeIsNoFileType) {
  EXPECT_FALSE(quant::ggml_type_traits(static_cast<uint32_t>(GgmlType::I8_ROWS)).has_value());
  EXPECT_FALSE(quant::ggml_type_named("int8").has_value());
  EXPECT_FALSE(quant::can_quantize(GgmlType::I8_ROWS));
  EXPECT_THROW(
      quant::quantized_from_blocks(torch::zeros({12}, torch::kByte), GgmlType::I8_ROWS, 3, 4, "w"),
      FormatError);
}

// The bound of the two roundings against the plain product (float64): x.w - x'.w' =
// x.(w - w') + (x - x').w', so per output sum_k |x_k| sw/2 + |w'_k| sx/2; plus the float32
// epilogue's roundings and, for bf16 outputs, one rounding to bf16.
void expect_within_quantization_bound(const torch::Tensor& x, const torch::Tensor& w,
                                      const torch::Tensor& bias, const torch::Tensor& y,
                                      const quant::QuantizedWeight& q) {
  const auto xd = x.to(torch::kDouble), wd = w.to(torch::kDouble);
  const auto exact = torch::matmul(xd, wd.t()) + bias.to(torch::kDouble);
  const auto sx = xd.abs().amax(-1, true) / 127.0;
  const auto sw = q.row_scales.to(torch::kDouble).unsqueeze(0);
  const auto wq = quant::dequantize_weight(q, torch::kDouble);
  const auto bound = torch::matmul(xd.abs(), torch::ones_like(wd).t()) * sw * 0.5 +
                     torch::matmul(torch::ones_like(xd), wq.abs().t()) * sx * 0.5;
  const double out_ulp = y.scalar_type() == torch::kBFloat16 ? 1.0 / 256 : 0;
  const auto slack = (exact.abs() + bound) * out_ulp +
                     1e-6 * (bound + exact.abs() + bias.to(torch::kDouble).abs() + 1);
  const auto err = (y.to(torch::kDouble) - exact).abs();
  EXPECT_TRUE(err.le(bound + slack).all().item<bool>())
      << "largest excess " << (err - bound - slack).max().item<double>();
  // The roundings' errors cancel in part: far inside the worst case.
  EXPECT_LT(err.max().item<double>(), 0.5 * bound.max().item<double>() + 1e-3);
}

TEST(Int8Linear, ProductWithinTheBoundOfItsRoundings) {
  if (!nn::int8_gemm_available()) GTEST_SKIP() << "no oneDNN integer GEMM or no AVX512-VNNI here";
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (int64_t m : {1, 37, 1100}) {  // 1100 rows: two GEMM calls of the row chunks
      const auto x = (torch::randn({m, 300}) * 2).to(dtype);
      const auto w = torch::randn({70, 300}) * 0.1;
      const auto bias = torch::randn({70});
      const auto q = quant::quantize_weight(w, GgmlType::I8_ROWS, "w");
      ASSERT_TRUE(nn::int8_linear_runs(x, q));
      const auto y = nn::int8_linear(x, q, bias.to(dtype));
      ASSERT_EQ(y.scalar_type(), dtype);
      expect_within_quantization_bound(x.to(torch::kFloat), w, bias.to(dtype).to(torch::kFloat), y,
                                       q);
      // A residual joins in the epilogue.
      const auto r = torch::randn({m, 70}).to(dtype);
      const auto yr = nn::int8_linear(x, q, bias.to(dtype), r);
      const double tol = dtype == torch::kBFloat16 ? 0.05 : 1e-4;
      EXPECT_TRUE(torch::allclose(yr.to(torch::kFloat), (y.to(torch::kFloat) + r.to(torch::kFloat)),
                                  0.02, tol));
    }
  }
  const auto q = quant::quantize_weight(torch::randn({8, 16}), GgmlType::I8_ROWS, "w");
  EXPECT_FALSE(nn::int8_linear_runs(torch::randn({2, 15}), q));  // another width
  EXPECT_FALSE(nn::int8_linear_runs(torch::randn({2, 16}).to(torch::kDouble), q));
  EXPECT_THROW(nn::int8_linear(torch::randn({2, 16}), q, torch::randn({7})), InvalidArgument);
}

TEST(Int8Linear, LayerRunsTheIntegerProductOrDequantizes) {
  torch::manual_seed(4);
  nn::Linear lin(nn::make_linear(64, 24));
  const auto w = lin->weight.detach().clone();
  const auto b = lin->bias.detach().clone();
  const auto layers = nn::quantize_linear_layers(*lin, GgmlType::I8_ROWS);
  EXPECT_EQ(layers.layers, 1);
  ASSERT_TRUE(lin->quantized);
  EXPECT_EQ(lin->quantized->type, GgmlType::I8_ROWS);
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({3, 5, 64});
  const auto y = lin->forward(x);
  ASSERT_EQ(y.sizes().vec(), (std::vector<int64_t>{3, 5, 24}));
  if (nn::int8_gemm_available()) expect_within_quantization_bound(x, w, b, y, *lin->quantized);
  // Where the integer product does not run (float64 here; other devices) the layer multiplies
  // by its dequantized weight.
  const auto xd = x.to(torch::kDouble);
  const auto want =
      torch::matmul(xd, quant::dequantize_weight(*lin->quantized, torch::kDouble).t()) +
      b.to(torch::kDouble);
  EXPECT_TRUE(torch::allclose(lin->forward(xd), want, 1e-12, 1e-12));
  const auto r = torch::randn({3, 5, 24});
  EXPECT_TRUE(torch::allclose(lin->forward_add(x, r), y + r, 1e-5, 1e-5));
}

}  // namespace test_int8_linear
}  // namespace diffuse
