// The fused-attention call path: nn::attention on the (simulated) npu calls
// npu::npu_fusion_attention / npu::npu_prompt_flash_attention through the dispatcher. The
// reference operators registered under those names honour layout, scale, mask polarity,
// token windows and output order, so these tests fail if our call gets any of them wrong.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "nn/attention.h"
#include "nn/attention_npu.h"
#include "nn/random_init.h"
#include "nn/transformer_2d.h"
#include "npu_sim/sim_fixture.h"
#include "cpu_bf16.h"
#include "test_util.h"

namespace diffuse {
namespace test_npu_sim_attention {

using test::SimulatedNpuTest;
using test::WarningCapture;

struct Qkv {
  torch::Tensor q, k, v;
};

Qkv random_qkv(int64_t b, int64_t h, int64_t nq, int64_t nk, int64_t d, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return {torch::randn({b, h, nq, d}, gen), torch::randn({b, h, nk, d}, gen),
          torch::randn({b, h, nk, d}, gen)};
}

nn::AttentionOptions with_backend(nn::AttentionBackend backend, bool causal = false) {
  nn::AttentionOptions o;
  o.backend = backend;
  o.causal = causal;
  return o;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max().item<double>();
}

TEST_F(SimulatedNpuTest, FusionAttentionMatchesMath) {
  auto x = random_qkv(2, 3, 7, 7, 16, 1);
  auto d = npu(0);
  auto out =
      nn::attention(x.q.to(d), x.k.to(d), x.v.to(d), with_backend(nn::AttentionBackend::kNpu));
  EXPECT_EQ(out.device(), d);
  auto expected = nn::attention(x.q, x.k, x.v, with_backend(nn::AttentionBackend::kMath));
  EXPECT_LT(max_diff(out.cpu(), expected), 1e-5);
  auto calls = device::sim::fused_attention_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].op, "npu_fusion_attention");
  EXPECT_EQ(calls[0].input_layout, "BNSD");
  EXPECT_EQ(calls[0].heads, 3);
  EXPECT_DOUBLE_EQ(calls[0].scale,
                   1.0 / std::sqrt(16.0));  // passed explicitly, not the default 1.0
  EXPECT_FALSE(calls[0].has_mask);
  EXPECT_EQ(calls[0].pre_tokens, 2147483647);
  EXPECT_EQ(calls[0].next_tokens, 2147483647);
}

TEST_F(SimulatedNpuTest, FusionAttentionCausalAndCrossAttention) {
  auto d = npu(0);
  auto self = random_qkv(1, 2, 9, 9, 8, 2);
  auto causal = nn::attention(self.q.to(d), self.k.to(d), self.v.to(d),
                              with_backend(nn::AttentionBackend::kNpu, true));
  auto expected =
      nn::attention(self.q, self.k, self.v, with_backend(nn::AttentionBackend::kMath, true));
  EXPECT_LT(max_diff(causal.cpu(), expected), 1e-5);
  auto calls = device::sim::fused_attention_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(calls[0].has_mask);
  EXPECT_EQ(calls[0].next_tokens, 0);

  auto cross = random_qkv(2, 4, 12, 5, 8, 3);  // 12 queries, 5 keys (text context)
  nn::AttentionOptions o = with_backend(nn::AttentionBackend::kNpu);
  o.scale = 0.3;
  auto got = nn::attention(cross.q.to(d), cross.k.to(d), cross.v.to(d), o);
  o.backend = nn::AttentionBackend::kMath;
  EXPECT_LT(max_diff(got.cpu(), nn::attention(cross.q, cross.k, cross.v, o)), 1e-5);
  EXPECT_DOUBLE_EQ(device::sim::fused_attention_calls().back().scale, 0.3);
}

TEST_F(SimulatedNpuTest, AutoBackendUsesTheFusedKernelOnTheNpuOnly) {
  auto x = random_qkv(1, 2, 6, 6, 8, 4);
  auto on_npu = nn::attention(x.q.to(npu(1)), x.k.to(npu(1)), x.v.to(npu(1)));
  EXPECT_EQ(on_npu.device(), npu(1));
  EXPECT_EQ(device::sim::fused_attention_calls().size(), 1u);
  nn::attention(x.q, x.k, x.v);
  nn::attention(x.q, x.k, x.v, with_backend(nn::AttentionBackend::kAuto));  // CPU tensors
  EXPECT_EQ(device::sim::fused_attention_calls().size(), 1u);
  EXPECT_TRUE(nn::npu_attention_unsupported(x.q.to(npu(0))).empty());
  EXPECT_FALSE(nn::npu_attention_unsupported(x.q).empty());
  // An explicit math choice is honoured on the npu too.
  nn::attention(x.q.to(npu(0)), x.k.to(npu(0)), x.v.to(npu(0)),
                with_backend(nn::AttentionBackend::kMath));
  EXPECT_EQ(device::sim::fused_attention_calls().size(), 1u);
}

TEST_F(SimulatedNpuTest, PromptFlashAttentionWhereFusionIsMissing) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();  // the simulated device runs the CPU's kernels
  // A 310P-like device: prompt flash attention in fp16 only.
  auto caps = device::sim::SimulatedNpuOptions::default_capabilities();
  caps.fusion_attention = false;
  caps.prompt_flash_attention_bf16 = false;
  caps.bf16 = false;
  device::sim::set_simulated_capabilities(caps);
  auto d = npu(0);
  auto x = random_qkv(2, 2, 10, 10, 16, 5);
  auto q = x.q.to(torch::kFloat16), k = x.k.to(torch::kFloat16), v = x.v.to(torch::kFloat16);
  EXPECT_EQ(nn::select_npu_attention_kernel(q.to(d)),
            nn::NpuAttentionKernel::kPromptFlashAttention);
  auto out = nn::attention(q.to(d), k.to(d), v.to(d), with_backend(nn::AttentionBackend::kNpu));
  EXPECT_EQ(out.scalar_type(), torch::kFloat16);
  auto expected = nn::attention(x.q, x.k, x.v, with_backend(nn::AttentionBackend::kMath));
  EXPECT_LT(max_diff(out.cpu(), expected), 5e-3);
  auto calls = device::sim::fused_attention_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].op, "npu_prompt_flash_attention");
  EXPECT_EQ(calls[0].input_layout, "BNSD");
  EXPECT_EQ(calls[0].heads, 2);
  // The operator's default next_tokens is 0 (causal): we must widen it for full attention.
  EXPECT_EQ(calls[0].next_tokens, 2147483647);
  EXPECT_EQ(calls[0].pre_tokens, 2147483647);

  // fp32 and bf16 are not supported here: auto takes another backend, no fused call.
  device::sim::reset_fused_attention_calls();
  for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
    auto qd = x.q.to(d, dt);
    EXPECT_EQ(nn::select_npu_attention_kernel(qd), nn::NpuAttentionKernel::kNone);
    auto r =
        nn::attention(qd, x.k.to(d, dt), x.v.to(d, dt), with_backend(nn::AttentionBackend::kAuto));
    EXPECT_LT(max_diff(r.cpu(), expected), dt == torch::kFloat32 ? 1e-5 : 5e-2);
  }
  EXPECT_TRUE(device::sim::fused_attention_calls().empty());
}

TEST_F(SimulatedNpuTest, NoFusedKernelOnDevicesWithoutThem) {
  auto caps = device::sim::SimulatedNpuOptions::default_capabilities();
  caps.fusion_attention = caps.prompt_flash_attention = false;
  device::sim::set_simulated_capabilities(caps);
  auto x = random_qkv(1, 1, 4, 4, 8, 6);
  auto out = nn::attention(x.q.to(npu(0)), x.k.to(npu(0)), x.v.to(npu(0)),
                           with_backend(nn::AttentionBackend::kAuto));
  EXPECT_LT(
      max_diff(out.cpu(), nn::attention(x.q, x.k, x.v, with_backend(nn::AttentionBackend::kMath))),
      1e-6);
  EXPECT_TRUE(device::sim::fused_attention_calls().empty());
}

TEST_F(SimulatedNpuTest, FailingFusedKernelIsDisabledWithOneWarning) {
  auto x = random_qkv(1, 2, 5, 5, 8, 7);
  auto q = x.q.to(npu(0)), k = x.k.to(npu(0)), v = x.v.to(npu(0));
  auto expected = nn::attention(x.q, x.k, x.v, with_backend(nn::AttentionBackend::kMath));
  WarningCapture warnings;
  device::sim::set_reference_ops_fail(true);
  for (int i = 0; i < 3; ++i) {
    auto out = nn::attention(q, k, v, with_backend(nn::AttentionBackend::kAuto));
    EXPECT_LT(max_diff(out.cpu(), expected), 1e-6);  // answered by the math path
  }
  device::sim::set_reference_ops_fail(false);
  EXPECT_EQ(warnings.count_containing("npu_fusion_attention failed"), 1);
  // Fusion was tried once, then prompt flash attention (fp32: not eligible), then math.
  EXPECT_EQ(device::sim::fused_attention_calls().size(), 1u);
  EXPECT_EQ(nn::select_npu_attention_kernel(q), nn::NpuAttentionKernel::kNone);
  nn::reset_npu_attention_failures();
  EXPECT_EQ(nn::select_npu_attention_kernel(q), nn::NpuAttentionKernel::kFusionAttention);
}

TEST_F(SimulatedNpuTest, TransformerBlockOnNpuMatchesCpu) {
  nn::Transformer2DOptions o;
  o.heads = 2;
  o.head_dim = 8;
  o.in_channels = 16;
  o.cross_attention_dim = 12;
  o.norm_num_groups = 4;
  o.use_linear_projection = true;
  nn::Transformer2DModel model(o);
  nn::init_random_weights(*model, 11);
  model->eval();
  auto gen = at::detail::createCPUGenerator(12);
  auto x = torch::randn({2, 16, 4, 4}, gen), ctx = torch::randn({2, 3, 12}, gen);
  torch::NoGradGuard no_grad;
  auto expected = model->forward(x, ctx);
  model->to(npu(0));
  auto got = model->forward(x.to(npu(0)), ctx.to(npu(0)));
  EXPECT_LT(max_diff(got.cpu(), expected), 1e-4);
  EXPECT_EQ(device::sim::fused_attention_calls().size(), 2u);  // self- and cross-attention
}

}  // namespace test_npu_sim_attention
}  // namespace diffuse
