// Norms and GEGLU with float32 statistics: every CPU kernel this machine runs against float64
// references of the same bf16 inputs, and the module wrappers against LibTorch in float32.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cpu_bf16.h"
#include "diffuse/errors.h"
#include "nn/attention.h"
#include "nn/fused_ops.h"
#include "nn/kernels/cpu_features.h"
#include "nn/layers.h"
#include "nn/load_weights.h"
#include "nn/resnet.h"
#include "test_util.h"

using namespace diffuse;

namespace test_fused_ops {

torch::Tensor bf16_randn(c10::IntArrayRef shape, double mean, double std, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return (torch::randn(shape, gen, torch::kFloat32) * std + mean).to(torch::kBFloat16);
}

const uint16_t* u16(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr());
}
uint16_t* u16_mut(torch::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data_ptr());
}

// |out - ref| within one bf16 rounding of the reference (plus a tiny absolute slack).
void expect_bf16_rounding(const torch::Tensor& out, const torch::Tensor& ref,
                          const std::string& what) {
  auto o = out.to(torch::kFloat64), r = ref.to(torch::kFloat64);
  auto bound = r.abs() * (1.0 / 256) + 1e-5;
  auto excess = ((o - r).abs() - bound).max().item<double>();
  EXPECT_LE(excess, 0.0) << what << ": max error " << (o - r).abs().max().item<double>();
}

// A float32 GEGLU a * gelu(g) against float64 on the same float32 inputs. The kernel's erf is
// good to 1.5e-7 absolute, so gelu(g) = g/2 (1 + erf) is off by up to |g| * 0.75e-7 plus a few
// float32 roundings of |g|-sized terms: the error scales with |a| |g|, not with the result (which
// cancels towards 0 for negative g).
void expect_f32_geglu(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& g,
                      const std::string& what) {
  auto ad = a.to(torch::kFloat64), gd = g.to(torch::kFloat64);
  auto ref = ad * 0.5 * gd * (1 + torch::erf(gd / std::sqrt(2.0)));
  const double u = std::ldexp(1.0, -24);  // float32 unit roundoff
  auto bound = ad.abs() * gd.abs() * (0.75e-7 + 8 * u) + ref.abs() * 2 * u + 1e-30;
  auto o = out.to(torch::kFloat64);
  auto excess = ((o - ref).abs() - bound).max().item<double>();
  EXPECT_LE(excess, 0.0) << what << ": max error " << (o - ref).abs().max().item<double>();
}

TEST(CpuKernels, EveryKernelMatchesFloat64) {
  ASSERT_FALSE(nn::kernels::runnable_cpu_kernels().empty());
  EXPECT_STREQ(nn::kernels::runnable_cpu_kernels().back()->name, "portable");
  for (const auto* k : nn::kernels::runnable_cpu_kernels()) {
    const std::string name = k->name;
    for (int64_t n : {1, 7, 16, 100, 5003, 70000}) {
      auto x = bf16_randn({n}, 10.0, 0.5, 11 + n);
      double mean = 0, var = 0;
      k->bf16_moments(u16(x), n, &mean, &var);
      auto xd = x.to(torch::kFloat64);
      EXPECT_NEAR(mean, xd.mean().item<double>(), 1e-6) << name << " n=" << n;
      EXPECT_NEAR(var, xd.var(/*unbiased=*/false).item<double>(), 1e-6) << name << " n=" << n;

      for (bool silu : {false, true}) {
        auto y = torch::empty_like(x);
        k->bf16_scale_shift(u16(x), n, 0.75f, -7.0f, silu, u16_mut(y));
        auto ref = xd * 0.75 - 7.0;
        if (silu) ref = ref * torch::sigmoid(ref);
        expect_bf16_rounding(y, ref, name + (silu ? " scale_shift+silu" : " scale_shift"));
      }

      auto a = bf16_randn({n}, 0.0, 1.0, 3 + n), g = bf16_randn({n}, 0.0, 2.0, 5 + n);
      auto ab = torch::randn({n}), gb = torch::randn({n});
      for (bool with_bias : {false, true}) {
        auto y = torch::empty_like(a);
        k->bf16_geglu(u16(a), u16(g), n, with_bias ? ab.data_ptr<float>() : nullptr,
                      with_bias ? gb.data_ptr<float>() : nullptr, u16_mut(y));
        auto ad = a.to(torch::kFloat64), gd = g.to(torch::kFloat64);
        if (with_bias) {
          ad = ad + ab.to(torch::kFloat64);
          gd = gd + gb.to(torch::kFloat64);
        }
        auto ref = ad * 0.5 * gd * (1 + torch::erf(gd / std::sqrt(2.0)));
        expect_bf16_rounding(y, ref,
                             name + " geglu n=" + std::to_string(n) + (with_bias ? " bias" : ""));
      }

      // float32: within the erf approximation's 1.5e-7 (times |a * g| / 2) and a few roundings.
      auto af = torch::randn({n}), gf = 2 * torch::randn({n});
      for (bool with_bias : {false, true}) {
        auto y = torch::empty_like(af);
        k->f32_geglu(af.data_ptr<float>(), gf.data_ptr<float>(), n,
                     with_bias ? ab.data_ptr<float>() : nullptr,
                     with_bias ? gb.data_ptr<float>() : nullptr, y.data_ptr<float>());
        auto ad = af.to(torch::kFloat64), gd = gf.to(torch::kFloat64);
        if (with_bias) {
          ad = ad + ab.to(torch::kFloat64);
          gd = gd + gb.to(torch::kFloat64);
        }
        auto ref = ad * 0.5 * gd * (1 + torch::erf(gd / std::sqrt(2.0)));
        auto bound = 2e-7 * (ref.abs() + ad.abs() * (gd.abs() + 1));
        auto excess = ((y.to(torch::kFloat64) - ref).abs() - bound).max().item<double>();
        EXPECT_LE(excess, 0.0) << name << " f32 geglu n=" << n << (with_bias ? " bias" : "");
      }

      // The residual's mean of 10 makes a second rounding (of product + bias) visible.
      auto r = bf16_randn({n}, 10.0, 1.0, 7 + n);
      for (bool with_bias : {false, true}) {
        auto y = a.clone();
        k->bf16_add_bias_residual(u16_mut(y), with_bias ? ab.data_ptr<float>() : nullptr, u16(r),
                                  n);
        auto ref = a.to(torch::kFloat64) + r.to(torch::kFloat64);
        if (with_bias) ref = ref + ab.to(torch::kFloat64);
        expect_bf16_rounding(y, ref, name + " add_bias_residual n=" + std::to_string(n));
      }
    }
    for (int64_t C : {3, 16, 40, 128}) {
      const int64_t P = 37;
      auto x = bf16_randn({P, C}, 5.0, 0.5, 23 + C);
      std::vector<float> shift(C, 4.0f), scratch(2 * C);
      std::vector<double> s1(C, 0.0), s2(C, 0.0);
      k->bf16_channel_sums(u16(x), P, C, shift.data(), scratch.data(), s1.data(), s2.data());
      auto d = x.to(torch::kFloat64) - 4.0;
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_NEAR(s1[c], d.select(1, c).sum().item<double>(), 1e-4) << name << " C=" << C;
        EXPECT_NEAR(s2[c], d.select(1, c).pow(2).sum().item<double>(), 1e-4) << name << " C=" << C;
      }
      auto scale = torch::randn({C}), sh = torch::randn({C});
      for (bool silu : {false, true}) {
        auto y = torch::empty_like(x);
        k->bf16_channel_scale_shift(u16(x), P, C, scale.data_ptr<float>(), sh.data_ptr<float>(),
                                    silu, u16_mut(y));
        auto ref = x.to(torch::kFloat64) * scale.to(torch::kFloat64) + sh.to(torch::kFloat64);
        if (silu) ref = ref * torch::sigmoid(ref);
        expect_bf16_rounding(y, ref, name + " channel_scale_shift C=" + std::to_string(C));
      }
    }
    for (int64_t d : {5, 320, 1024, 1283}) {
      auto x = bf16_randn({d}, 10.0, 0.5, 17 + d);
      auto w = torch::randn({d}), b = torch::randn({d});
      auto y = torch::empty_like(x);
      k->bf16_layer_norm_row(u16(x), d, w.data_ptr<float>(), b.data_ptr<float>(), 1e-5f,
                             u16_mut(y));
      auto ref = torch::layer_norm(x.to(torch::kFloat64), {d}, w.to(torch::kFloat64),
                                   b.to(torch::kFloat64), 1e-5);
      expect_bf16_rounding(y, ref, name + " layer_norm d=" + std::to_string(d));
    }
  }
}

TEST(FusedOps, Bf16GroupNormKeepsFloat32Statistics) {
  torch::NoGradGuard no_grad;
  auto x = bf16_randn({2, 64, 9, 11}, 3.0, 0.5, 1);
  auto w = (torch::randn({64}) * 0.2 + 1).to(torch::kBFloat16),
       b = (torch::randn({64}) * 0.1).to(torch::kBFloat16);
  for (bool silu : {false, true}) {
    auto ref = torch::group_norm(x.to(torch::kFloat64), 8, w.to(torch::kFloat64),
                                 b.to(torch::kFloat64), 1e-6);
    if (silu) ref = torch::silu(ref);
    auto y = nn::group_norm(x, 8, w, b, 1e-6, silu);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    expect_bf16_rounding(y, ref, silu ? "group_norm+silu" : "group_norm");
    // Channels-last input has its own kernel (LibTorch 1.13's bf16 path is wrong there).
    auto cl = nn::group_norm(x.contiguous(torch::MemoryFormat::ChannelsLast), 8, w, b, 1e-6, silu);
    EXPECT_TRUE(cl.is_contiguous(torch::MemoryFormat::ChannelsLast));
    expect_bf16_rounding(cl, ref, "channels-last group_norm");
  }
}

TEST(FusedOps, GroupNormOverwritingItsInputGivesTheSameResult) {
  torch::NoGradGuard no_grad;
  auto x = bf16_randn({2, 64, 9, 11}, 3.0, 0.5, 4);
  auto w = torch::randn({64}).to(torch::kBFloat16), b = torch::randn({64}).to(torch::kBFloat16);
  for (auto format : {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast}) {
    for (auto dtype : {torch::kBFloat16, torch::kFloat32}) {
      auto in = x.to(dtype).contiguous(format);
      auto expected = nn::group_norm(in, 8, w.to(dtype), b.to(dtype), 1e-6, true);
      auto scratch = in.clone(format);
      auto got = nn::group_norm(scratch, 8, w.to(dtype), b.to(dtype), 1e-6, true,
                                /*overwrite_input=*/true);
      EXPECT_TRUE(got.equal(expected)) << dtype << " " << format;
    }
  }
}

TEST(ResnetBlock2D, ReusesOnlyAMovedInInputAndComputesTheSame) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  torch::NoGradGuard no_grad;
  for (auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    for (int64_t out : {32, 64}) {  // with and without conv_shortcut
      nn::ResnetBlock2DOptions o;
      o.in_channels = 64;
      o.out_channels = out;
      o.temb_channels = 0;
      o.groups = 8;
      nn::ResnetBlock2D block(o);
      block->to(dtype);
      auto x = bf16_randn({1, 64, 8, 8}, 0.0, 1.0, 5).to(dtype);
      auto kept = x.clone();
      auto expected = block(x);  // the caller keeps x: it must stay as it was
      EXPECT_TRUE(x.equal(kept)) << dtype << " out=" << out;
      auto moved = x.clone();
      auto got = block(std::move(moved));  // the block may reuse this one
      EXPECT_TRUE(got.equal(expected)) << dtype << " out=" << out;
    }
  }
}

TEST(FusedOps, Bf16LayerNormAndModules) {
  torch::NoGradGuard no_grad;
  auto x = bf16_randn({3, 5, 320}, 10.0, 0.5, 2);
  nn::LayerNorm ln(torch::nn::LayerNormOptions({320}).eps(1e-5));
  ln->weight.normal_(1.0, 0.2);
  ln->bias.normal_(0.0, 0.1);
  auto ref = torch::layer_norm(x.to(torch::kFloat64), {320}, ln->weight.to(torch::kFloat64),
                               ln->bias.to(torch::kFloat64), 1e-5);
  ln->to(torch::kBFloat16);
  // The reference used the float32 parameters; compare with bf16-rounded ones instead.
  ref = torch::layer_norm(x.to(torch::kFloat64), {320}, ln->weight.to(torch::kFloat64),
                          ln->bias.to(torch::kFloat64), 1e-5);
  expect_bf16_rounding(ln(x), ref, "LayerNorm module");
  // Non-contiguous input goes through the float32 fallback.
  auto xt = bf16_randn({320, 6}, 1.0, 1.0, 3).t();
  auto ref_t = torch::layer_norm(xt.to(torch::kFloat64), {320}, ln->weight.to(torch::kFloat64),
                                 ln->bias.to(torch::kFloat64), 1e-5);
  expect_bf16_rounding(ln(xt), ref_t, "LayerNorm module, transposed input");

  nn::GroupNorm gn(torch::nn::GroupNormOptions(4, 16).eps(1e-6));
  auto xf = torch::randn({2, 16, 5, 5});
  EXPECT_TRUE(
      gn(xf).equal(torch::group_norm(xf, 4, gn->weight, gn->bias, 1e-6)));  // float32: LibTorch's
  EXPECT_TRUE(gn->forward_silu(xf).allclose(
      torch::silu(torch::group_norm(xf, 4, gn->weight, gn->bias, 1e-6))));
  EXPECT_EQ(gn->named_parameters().size(), 2u);
}

TEST(FusedOps, GegluMatchesChunkGelu) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(41);
  auto h = torch::randn({2, 7, 2 * 40}, gen, torch::kFloat32) * 3;
  auto parts = h.chunk(2, -1);
  auto ref32 = parts[0] * torch::gelu(parts[1]);
  // float32: the one-pass kernel, within its erf approximation of the exact GELU.
  const auto saved = nn::default_attention_backend();
  nn::set_default_attention_backend(nn::AttentionBackend::kAuto);
  EXPECT_TRUE(nn::fused_f32_geglu(h));
  expect_f32_geglu(nn::geglu(h), parts[0], parts[1], "float32 geglu");
  EXPECT_FALSE(nn::geglu(h).equal(ref32)) << "float32 took LibTorch's ops, not the kernel";
  // The reference path (`--attention math`): LibTorch's ops, bit for bit.
  nn::set_default_attention_backend(nn::AttentionBackend::kMath);
  EXPECT_FALSE(nn::fused_f32_geglu(h));
  EXPECT_TRUE(nn::geglu(h).equal(ref32));
  nn::set_default_attention_backend(saved);
  // Inputs the kernel does not take (strided; autograd) go through LibTorch's ops.
  auto strided = torch::randn({2, 2 * 40, 7}).transpose(1, 2);
  auto sp = strided.chunk(2, -1);
  EXPECT_TRUE(nn::geglu(strided).equal(sp[0] * torch::gelu(sp[1])));
  {
    torch::AutoGradMode grad(true);
    auto hg = h.clone().requires_grad_();
    auto out = nn::geglu(hg);
    EXPECT_TRUE(out.requires_grad());
    EXPECT_TRUE(out.equal(ref32));
  }
  auto hb = h.to(torch::kBFloat16);
  auto pb = hb.to(torch::kFloat64).chunk(2, -1);
  auto ref = pb[0] * 0.5 * pb[1] * (1 + torch::erf(pb[1] / std::sqrt(2.0)));
  expect_bf16_rounding(nn::geglu(hb), ref, "bf16 geglu");
  EXPECT_THROW(nn::geglu(torch::randn({2, 3})), std::exception);

  // With the projection's bias: the bias joins the kernel's pass.
  auto bias = torch::randn({2 * 40}, gen, torch::kFloat32);
  auto pbias = (h + bias).chunk(2, -1);  // float32 sums, as the kernel adds them
  expect_f32_geglu(nn::geglu(h, bias), pbias[0], pbias[1], "float32 geglu with bias");
  auto pbb = (hb.to(torch::kFloat64) + bias.to(torch::kBFloat16).to(torch::kFloat64)).chunk(2, -1);
  auto refb = pbb[0] * 0.5 * pbb[1] * (1 + torch::erf(pbb[1] / std::sqrt(2.0)));
  expect_bf16_rounding(nn::geglu(hb, bias.to(torch::kBFloat16)), refb, "bf16 geglu with bias");
  EXPECT_THROW(nn::geglu(hb, torch::randn({7})), std::exception);
}

// Linear's fused epilogue (bf16 CPU): the same value as forward(x) + residual within one bf16
// rounding of the exact sum, for plain, bias-free and low-rank-updated layers; other dtypes
// and shapes take LibTorch's ops and give exactly forward(x) + residual.
TEST(FusedOps, LinearForwardAddMatchesForwardPlusResidual) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  torch::NoGradGuard no_grad;
  for (bool bias : {true, false}) {
    nn::Linear lin(torch::nn::LinearOptions(48, 40).bias(bias));
    auto x = torch::randn({2, 9, 48}), res = torch::randn({2, 9, 40}) * 4 + 10;
    EXPECT_TRUE(lin->forward_add(x, res).equal(lin(x) + res));  // float32
    EXPECT_TRUE(lin->forward_add(x, res.select(0, 0)).equal(lin(x) + res.select(0, 0)));

    lin->to(torch::kBFloat16);
    lin->low_rank.push_back({torch::randn({4, 48}).to(torch::kBFloat16) * 0.1,
                             torch::randn({40, 4}).to(torch::kBFloat16) * 0.1, 0.5});
    auto xb = x.to(torch::kBFloat16), rb = res.to(torch::kBFloat16);
    const auto& u = lin->low_rank.back();
    auto xd = xb.to(torch::kFloat64);
    auto product = torch::matmul(xd, lin->weight.to(torch::kFloat64).t()) +
                   0.5 * torch::matmul(torch::matmul(xd, u.down.to(torch::kFloat64).t()),
                                       u.up.to(torch::kFloat64).t());
    auto exact = product + rb.to(torch::kFloat64);
    if (bias) exact = exact + lin->bias.to(torch::kFloat64);
    auto fused = lin->forward_add(xb, rb);
    EXPECT_EQ(fused.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(fused.sizes().equals(rb.sizes()));
    // bf16 roundings of the product, of the low-rank term and of the sum: a few ulps of the
    // terms' magnitudes. The unfused ops round once more, so they stay as close.
    auto slack = (product.abs() + rb.to(torch::kFloat64).abs()) * (4.0 / 256) + 0.05;
    auto err = (fused.to(torch::kFloat64) - exact).abs();
    EXPECT_LE((err - slack).max().item<double>(), 0.0) << "max error " << err.max().item<double>();
    auto unfused_err = ((lin(xb) + rb).to(torch::kFloat64) - exact).abs();
    EXPECT_LE((unfused_err - slack).max().item<double>(), 0.0);
    EXPECT_GT(err.max().item<double>(), 0.0);  // bf16 is in effect
  }
}

TEST(Layers, SkipInitGuardBuildsTheSameParametersUninitialised) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  auto build = [] {
    return std::vector<torch::nn::AnyModule>{
        torch::nn::AnyModule(nn::make_linear(torch::nn::LinearOptions(6, 5).bias(false))),
        torch::nn::AnyModule(
            nn::make_conv2d(torch::nn::Conv2dOptions(4, 6, 3).stride(2).padding(1))),
        torch::nn::AnyModule(nn::make_embedding(11, 3))};
  };
  auto plain = build();
  std::vector<torch::nn::AnyModule> skipped;
  {
    nn::SkipInitGuard guard(torch::kBFloat16);
    skipped = build();
  }
  for (size_t i = 0; i < plain.size(); ++i) {
    auto a = plain[i].ptr()->named_parameters(), b = skipped[i].ptr()->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) {
      EXPECT_EQ(a[j].key(), b[j].key());
      EXPECT_EQ(a[j].value().sizes(), b[j].value().sizes()) << a[j].key();
      EXPECT_EQ(a[j].value().scalar_type(), torch::kFloat32);
      EXPECT_EQ(b[j].value().scalar_type(), torch::kBFloat16);
    }
  }
  // Without the guard: LibTorch's initialisation (kaiming-uniform bound 1/sqrt(fan_in)).
  auto lin = nn::make_linear(6, 5);
  EXPECT_LE(lin->weight.abs().max().item<double>(), 1.0 / std::sqrt(6.0) + 1e-6);
  EXPECT_GT(lin->weight.abs().max().item<double>(), 0);
  // The conv keeps its stride and padding: 4x9x9 -> 6x5x5.
  torch::NoGradGuard no_grad;
  skipped[1].ptr()->parameters()[0].normal_();
  auto y = skipped[1].forward(torch::randn({1, 4, 9, 9}).to(torch::kBFloat16));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{1, 6, 5, 5}));
}

// Deferred weights take no memory until loaded; loading gives each its file's values in the
// guard's dtype, and a missing one is still named.
TEST(Layers, DeferredWeightsGetTheirStorageWhenLoaded) {
  torch::nn::Sequential net;
  {
    nn::SkipInitGuard guard(torch::kFloat32, nn::SkipInitGuard::Weights::kDeferred);
    net = torch::nn::Sequential(nn::make_linear(torch::nn::LinearOptions(64, 32)),
                                nn::make_conv2d(torch::nn::Conv2dOptions(4, 6, 3).padding(1)),
                                nn::make_conv2d(torch::nn::Conv2dOptions(6, 5, 1)),
                                nn::make_embedding(11, 3));
  }
  std::map<std::string, torch::Tensor> file;
  int64_t deferred = 0;
  for (const auto& p : net->named_parameters()) {
    if (nn::has_deferred_storage(p.value())) {
      ++deferred;
      EXPECT_LE(p.value().storage().nbytes(), 4) << p.key();
    }
    file[p.key()] = torch::randn(p.value().sizes()).to(torch::kBFloat16);
  }
  EXPECT_EQ(deferred, 4);  // the weights (a 1x1 convolution's too); biases are allocated
  auto partial = file;
  partial.erase("1.weight");
  EXPECT_NE(test::expect_throw<FormatError>([&] {
              nn::load_state_dict(*net, partial, "f");
            }).find("1.weight"),
            std::string::npos);
  nn::load_state_dict(*net, file, "f");
  EXPECT_EQ(nn::resident_parameter_bytes(*net),
            4 * (32 * 64 + 32 + 6 * 4 * 9 + 6 + 5 * 6 + 5 + 11 * 3));
  for (const auto& p : net->named_parameters()) {
    EXPECT_FALSE(nn::has_deferred_storage(p.value())) << p.key();
    EXPECT_TRUE(p.value().is_contiguous()) << p.key();
    EXPECT_EQ(p.value().scalar_type(), torch::kFloat32) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), file[p.key()].to(torch::kFloat32))) << p.key();
  }
  // A plain weight is not mistaken for a deferred one.
  EXPECT_FALSE(nn::has_deferred_storage(torch::zeros({3, 4})));
  EXPECT_FALSE(nn::has_deferred_storage(torch::zeros({1}).expand({1})));
}

}  // namespace test_fused_ops
