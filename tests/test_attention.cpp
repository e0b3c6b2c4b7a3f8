// Attention backends against a float64 reference: every backend and every flash kernel this
// CPU runs, over SD-like and odd shapes, fp32 and bf16, causal and upcast.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>

#include "cpu_bf16.h"
#include "diffuse/errors.h"
#include "nn/attention.h"
#include "nn/attention/backends.h"
#include "nn/attention/flash.h"

using namespace diffuse;
using nn::AttentionBackend;

namespace test_attention {

struct Shape {
  int64_t B, H, Nq, Nk, D;
  bool causal;
};

std::string describe(const Shape& s, torch::Dtype dtype) {
  return "B=" + std::to_string(s.B) + " H=" + std::to_string(s.H) + " Nq=" + std::to_string(s.Nq) +
         " Nk=" + std::to_string(s.Nk) + " D=" + std::to_string(s.D) + (s.causal ? " causal" : "") +
         (dtype == torch::kBFloat16 ? " bf16" : " fp32");
}

struct Inputs {
  torch::Tensor q, k, v;
};

// q, k, v as the models make them: [B, N, H, D] memory viewed as [B, H, N, D]. `sharpness`
// scales q so that some softmax rows are nearly one-hot.
Inputs make_inputs(const Shape& s, torch::Dtype dtype, uint64_t seed, double sharpness = 1.0) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto rnd = [&](int64_t n) {
    return torch::randn({s.B, n, s.H, s.D}, gen, torch::kFloat32).to(dtype).transpose(1, 2);
  };
  Inputs in;
  in.q = (rnd(s.Nq) * sharpness).to(dtype);
  in.k = rnd(s.Nk);
  in.v = rnd(s.Nk);
  return in;
}

// float64 math attention of the same (already rounded) inputs.
torch::Tensor reference(const Inputs& in, const nn::AttentionOptions& o) {
  nn::AttentionOptions ref = o;
  ref.backend = AttentionBackend::kMath;
  return nn::attention(in.q.to(torch::kFloat64), in.k.to(torch::kFloat64), in.v.to(torch::kFloat64),
                       ref);
}

double max_err(const torch::Tensor& a, const torch::Tensor& ref) {
  return (a.to(torch::kFloat64) - ref).abs().max().item<double>();
}

// What float32 arithmetic can do to each output element (float64 from the rounded inputs,
// without bias): rounding the dot products moves logit j by up to (D + 4) eps sum_i |q_i k_ji|
// scale, which moves the output by that times sum_j p_j |v_j - o| (<= sum_j p_j |v_j| + |o|);
// the weighted sum of the values and the normalisation add up to (Nk + 4) eps sum_j p_j |v_j|.
// Twice that leaves room for an online softmax's rescaling (a few more roundings per key block).
torch::Tensor fp32_error_bound(const Inputs& in, const nn::AttentionOptions& o) {
  const auto q = in.q.to(torch::kFloat64), k = in.k.to(torch::kFloat64),
             v = in.v.to(torch::kFloat64);
  const int64_t D = q.size(3), Nq = q.size(2), Nk = k.size(2);
  const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  auto scores = torch::matmul(q, k.transpose(2, 3)) * scale;
  auto magnitude = torch::matmul(q.abs(), k.abs().transpose(2, 3)) * scale;
  if (o.causal) {
    const auto mask = torch::ones({Nq, Nk}, torch::kBool).triu(1);
    scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
    magnitude = magnitude.masked_fill(mask, 0.0);
  }
  const auto p = scores.softmax(-1);                             // [B, H, Nq, Nk]
  const auto out = torch::matmul(p, v);                          // [B, H, Nq, Dv]
  const double eps = std::numeric_limits<float>::epsilon() / 2;  // unit roundoff
  const auto logit_shift = std::get<0>(magnitude.max(-1, true)) * ((D + 4) * eps);  // [.., Nq, 1]
  const auto weighted = torch::matmul(p, v.abs());  // sum_j p_j |v_j|
  // sum_j p_j |v_j - o| <= sum_j p_j |v_j| + |o|
  return 2 * (logit_shift * (weighted + out.abs()) + weighted * ((Nk + 4) * eps));
}

// fp32: within what the arithmetic can do (fp32_error_bound); bf16: the output rounding (2^-8
// relative) plus bf16 probabilities, compared with the math backend's own error on the same
// inputs.
void expect_close(const torch::Tensor& out, const torch::Tensor& math_out, const torch::Tensor& ref,
                  torch::Dtype dtype, const std::string& what, const torch::Tensor& bound = {}) {
  ASSERT_EQ(out.sizes(), ref.sizes()) << what;
  ASSERT_EQ(out.scalar_type(), dtype) << what;
  const double err = max_err(out, ref), math_err = max_err(math_out, ref);
  if (dtype == torch::kFloat32) {
    ASSERT_TRUE(bound.defined()) << what;
    const auto excess = (out.to(torch::kFloat64) - ref).abs() - bound;
    EXPECT_LE(excess.max().item<double>(), 0.0)
        << what << ": max error " << err << ", the bound there "
        << bound.flatten()[excess.flatten().argmax()].item<double>() << " (math's error "
        << math_err << ")";
  } else {
    EXPECT_LT(err, std::max(2.0 * math_err, 1.6e-2))
        << what << " (math's error " << math_err << ")";
    auto mean_err = [&](const torch::Tensor& t) {
      return (t.to(torch::kFloat64) - ref).abs().mean().item<double>();
    };
    EXPECT_LT(mean_err(out), std::max(2.0 * mean_err(math_out), 4e-3)) << what;
  }
}

// With `sample_rows` > 0 (non-causal only), the float64 reference and the math backend see
// only that many query rows spread over the sequence (a query row's result does not depend on
// the other rows), which keeps long sequences cheap; the backends under test run in full.
void check_all_backends(const Shape& s, torch::Dtype dtype, bool upcast = false,
                        double sharpness = 1.0, int64_t sample_rows = 0) {
  if (dtype == torch::kBFloat16) DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  torch::NoGradGuard no_grad;
  auto in = make_inputs(s, dtype, 1234 + s.Nq * 7 + s.Nk, sharpness);
  torch::Tensor rows;
  Inputs sub = in;
  if (sample_rows > 0) {
    rows = torch::linspace(0, static_cast<double>(s.Nq - 1), sample_rows).to(torch::kInt64);
    sub.q = in.q.index_select(2, rows);
  }
  auto pick = [&](const torch::Tensor& out) {
    return rows.defined() ? out.index_select(2, rows) : out;
  };
  nn::AttentionOptions o;
  o.causal = s.causal;
  o.upcast = upcast;
  auto ref = reference(sub, o);
  o.backend = AttentionBackend::kMath;
  auto math_out = nn::attention(sub.q, sub.k, sub.v, o);
  const std::string what = describe(s, dtype) + (upcast ? " upcast" : "");
  const auto bound = dtype == torch::kFloat32 ? fp32_error_bound(sub, o) : torch::Tensor();
  expect_close(math_out, math_out, ref, dtype, what + " [math]", bound);
  for (auto b : nn::available_attention_backends(torch::Device(torch::kCPU))) {
    if (b == AttentionBackend::kMath) continue;
    o.backend = b;
    expect_close(pick(nn::attention(in.q, in.k, in.v, o)), math_out, ref, dtype,
                 what + " [" + nn::attention_backend_name(b) + "]", bound);
  }
  for (const auto& kernel : nn::flash_kernel_names(dtype)) {
    expect_close(pick(nn::flash_attention_with_kernel(kernel, in.q, in.k, in.v, o)), math_out, ref,
                 dtype, what + " [flash " + kernel + "]", bound);
  }
}

TEST(Attention, OddShapesAllBackends) {
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (bool causal : {false, true}) {
      check_all_backends({2, 3, 37, 53, 40, causal}, dtype);
      check_all_backends({1, 2, 5, 300, 17, causal}, dtype);  // odd head dim, > one key block
      check_all_backends({3, 1, 97, 97, 80, causal}, dtype);  // SD1.5's head dim 80
    }
  }
}

TEST(Attention, ClipTextEncoderCausal) {
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    check_all_backends({2, 16, 77, 77, 64, true}, dtype);
}

TEST(Attention, StableDiffusionCrossAttention) {
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    check_all_backends({2, 5, 1024, 77, 64, false}, dtype);
}

TEST(Attention, StableDiffusionSelfAttention) {
  check_all_backends({2, 20, 256, 256, 64, false}, torch::kBFloat16);
  check_all_backends({1, 10, 1024, 1024, 64, false}, torch::kFloat32, false, 1.0,
                     /*sample_rows=*/128);
  check_all_backends({1, 5, 4096, 4096, 64, false}, torch::kBFloat16, /*upcast=*/true, 1.0,
                     /*sample_rows=*/128);
}

TEST(Attention, LongSequenceOneHead) {
  // SD2.1 at 768x768: 96x96 latent tokens. One head keeps the math reference small.
  check_all_backends({1, 1, 9216, 9216, 64, false}, torch::kBFloat16, false, 1.0,
                     /*sample_rows=*/64);
}

TEST(Attention, VaeMidBlockHeadDim512) {
  check_all_backends({1, 1, 256, 256, 512, false}, torch::kFloat32);
  check_all_backends({1, 1, 256, 256, 512, false}, torch::kBFloat16, /*upcast=*/true);
}

TEST(Attention, SharpSoftmaxIsStable) {
  // Logits of hundreds: the online softmax must subtract running maxima correctly.
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    check_all_backends({1, 2, 64, 700, 64, false}, dtype, false, 40.0);
}

TEST(Attention, CustomScaleAndContiguousInputs) {
  torch::NoGradGuard no_grad;
  auto q = torch::randn({2, 4, 33, 32}), k = torch::randn({2, 4, 65, 32}),
       v = torch::randn({2, 4, 65, 32});
  nn::AttentionOptions o;
  o.scale = 0.37;
  auto ref = reference({q, k, v}, o);
  o.backend = AttentionBackend::kFlash;
  auto out = nn::attention(q, k, v, o);
  EXPECT_LT(max_err(out, ref), 2e-5);
  // The result is laid out [B, N, H, D]: transposing back gives contiguous tokens.
  EXPECT_TRUE(out.transpose(1, 2).is_contiguous());
}

TEST(Attention, ParseAndNames) {
  for (const char* n : {"auto", "math", "sdpa", "flash", "npu"})
    EXPECT_STREQ(nn::attention_backend_name(nn::parse_attention_backend(n)), n);
  EXPECT_THROW(nn::parse_attention_backend("fast"), InvalidArgument);
}

TEST(Attention, AvailabilityOnCpu) {
  torch::Device cpu(torch::kCPU);
  EXPECT_EQ(nn::attention_backend_unavailable(AttentionBackend::kMath, cpu), "");
  EXPECT_EQ(nn::attention_backend_unavailable(AttentionBackend::kFlash, cpu), "");
#if TORCH_VERSION_MAJOR < 2
  std::string why = nn::attention_backend_unavailable(AttentionBackend::kSdpa, cpu);
  EXPECT_NE(why.find("2.0"), std::string::npos) << why;
  try {
    nn::attention_backend_from_flag_or_env("sdpa", cpu);
    FAIL() << "sdpa accepted on libtorch < 2";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sdpa"), std::string::npos) << e.what();
  }
#endif
  EXPECT_FALSE(nn::flash_kernel_names(torch::kFloat32).empty());
  EXPECT_EQ(nn::flash_kernel_names(torch::kFloat32).back(), "portable");
}

TEST(Attention, ExplicitBackendRejectsInputsItCannotRun) {
  auto q = torch::randn({1, 1, 4, 8}, torch::kFloat64);
  nn::AttentionOptions o;
  o.backend = AttentionBackend::kFlash;
  try {
    nn::attention(q, q, q, o);
    FAIL() << "flash ran float64";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("flash"), std::string::npos) << e.what();
  }
  // auto falls back to math for what flash cannot run.
  o.backend = AttentionBackend::kAuto;
  EXPECT_EQ(nn::select_attention_backend(q, q, q, o), AttentionBackend::kMath);
  EXPECT_THROW(nn::attention(q, q.slice(3, 0, 4), q, o), InvalidArgument);
  EXPECT_THROW(nn::attention(q[0], q[0], q[0], o), InvalidArgument);
}

TEST(Attention, AutoPolicyOnCpu) {
  auto big = torch::randn({1, 5, 4096, 64}).to(torch::kBFloat16);
  auto cross = torch::randn({1, 5, 77, 64}).to(torch::kBFloat16);
  EXPECT_EQ(nn::select_attention_backend(big, big, big), AttentionBackend::kFlash);
  EXPECT_EQ(nn::select_attention_backend(big, cross, cross), AttentionBackend::kFlash);
  auto half = big.to(torch::kFloat16);  // flash takes float32 and bf16 only
  EXPECT_EQ(nn::select_attention_backend(half, half, half), AttentionBackend::kMath);
  // An explicit default wins over the policy.
  nn::set_default_attention_backend(AttentionBackend::kMath);
  EXPECT_EQ(nn::select_attention_backend(big, big, big), AttentionBackend::kMath);
  nn::set_default_attention_backend(AttentionBackend::kAuto);
}

std::atomic<int> g_fake_npu_calls{0};
torch::Tensor fake_npu(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const nn::AttentionCall& call) {
  ++g_fake_npu_calls;
  return nn::math_attention(q, k, v, call);
}

TEST(Attention, NpuHookRegistersABackend) {
  torch::Device cpu(torch::kCPU);
  EXPECT_NE(nn::attention_backend_unavailable(AttentionBackend::kNpu, cpu), "");
  nn::AttentionBackendHooks hooks;
  hooks.run = fake_npu;
  nn::register_attention_backend(AttentionBackend::kNpu, hooks);
  EXPECT_EQ(nn::attention_backend_unavailable(AttentionBackend::kNpu, cpu), "");
  auto q = torch::randn({1, 2, 3, 4});
  nn::AttentionOptions o;
  o.backend = AttentionBackend::kNpu;
  auto out = nn::attention(q, q, q, o);
  EXPECT_EQ(g_fake_npu_calls.load(), 1);
  o.backend = AttentionBackend::kMath;
  EXPECT_TRUE(out.allclose(nn::attention(q, q, q, o)));
  EXPECT_THROW(nn::register_attention_backend(AttentionBackend::kNpu, {}), InvalidArgument);
  // Put back an unavailable npu slot for the rest of this process.
  hooks.unavailable = [](const torch::Device&) { return std::string("test hook removed"); };
  nn::register_attention_backend(AttentionBackend::kNpu, hooks);
}

}  // namespace test_attention
