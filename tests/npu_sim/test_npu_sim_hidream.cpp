// HiDream's transformer on the (simulated) npu: the fused operators diffuse calls there
// (npu_rms_norm, npu_rotary_mul in interleave mode, npu_grouped_matmul for the experts) go
// through the dispatcher to reference kernels with the real schemas, and the model's output
// matches the CPU's. `--attention math` switches them off.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "io/json_config.h"
#include "io/model_folder.h"
#include "models/hidream_transformer.h"
#include "nn/npu_fused_ops.h"
#include "npu_sim/sim_fixture.h"
#include "pipeline/hidream.h"
#include "pipeline/stable_diffusion.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_npu_sim_hidream {

using test::SimulatedNpuTest;

models::HiDreamImageTransformer2DModel tiny_hidream() {
  nlohmann::json j = {{"patch_size", 2},
                      {"in_channels", 4},
                      {"num_layers", 1},
                      {"num_single_layers", 1},
                      {"attention_head_dim", 8},
                      {"num_attention_heads", 2},
                      {"caption_channels", {6, 10}},
                      {"text_emb_dim", 5},
                      {"num_routed_experts", 3},
                      {"num_activated_experts", 2},
                      {"axes_dims_rope", {2, 2, 4}},
                      {"max_resolution", {8, 8}},
                      {"llama_layers", {1, 0}}};
  torch::manual_seed(3);
  models::HiDreamImageTransformer2DModel m(
      models::HiDreamTransformerConfig::from_json(io::JsonConfig(j, "transformer/config.json")));
  m->eval();
  return m;
}

class NpuSimHiDream : public SimulatedNpuTest {
 protected:
  void SetUp() override {
    SimulatedNpuTest::SetUp();
    device::sim::register_reference_npu_hidream_ops();
    device::sim::reset_reference_op_calls();
    nn::reset_npu_fused_op_failures();
  }
};

torch::Tensor run(models::HiDreamImageTransformer2DModel& m, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  auto x = torch::randn({2, 4, 4, 6}), t = torch::tensor({900.0f, 10.0f});
  auto t5 = torch::randn({2, 5, 6}), llama = torch::randn({2, 2, 3, 10}),
       pooled = torch::randn({2, 5});
  m->to(device);
  auto out = m->forward(x.to(device), t, t5.to(device), llama.to(device), pooled.to(device));
  return out.to(torch::kCPU);
}

TEST_F(NpuSimHiDream, FusedOperatorsMatchTheCpu) {
  auto m = tiny_hidream();
  auto cpu = run(m, torch::kCPU);
  auto on_npu = run(m, npu());
  EXPECT_LT((on_npu - cpu).abs().max().item<double>(), 1e-5);
  // q/k norms of 1 dual (x4) + 1 single (x2) blocks, q and k rotated in each, three grouped
  // GEMMs per MoE (2 blocks).
  EXPECT_EQ(device::sim::reference_op_calls("npu_rms_norm"), 6);
  EXPECT_EQ(device::sim::reference_op_calls("npu_rotary_mul:interleave"), 4);
  EXPECT_EQ(device::sim::reference_op_calls("npu_grouped_matmul"), 6);
}

TEST_F(NpuSimHiDream, MathAttentionSwitchesFusedOperatorsOff) {
  auto m = tiny_hidream();
  auto cpu = run(m, torch::kCPU);
  nn::set_default_attention_backend(nn::AttentionBackend::kMath);
  auto on_npu = run(m, npu());
  EXPECT_LT((on_npu - cpu).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(device::sim::reference_op_calls("npu_rms_norm"), 0);
  EXPECT_EQ(device::sim::reference_op_calls("npu_rotary_mul:interleave"), 0);
  EXPECT_EQ(device::sim::reference_op_calls("npu_grouped_matmul"), 0);
}

// HiDream-E1 editing, the whole pipeline (four text encoders, VAE encode of the source,
// 3-branch guidance, decode) from the same seed on the cpu and on the simulated npu with its
// fused operators: the same 8-bit image. Runs on the golden set's tiny E1 weights.
TEST_F(NpuSimHiDream, SameSeedGivesTheSameEditOnCpuAndNpu) {
  const std::string set_dir = test::hidream_golden_dir();
  if (!std::filesystem::exists(set_dir + "/cases.json"))
    GTEST_SKIP() << "no golden set at " << set_dir;
  const auto folder = io::ModelFolder::open(verify::GoldenSet::load(set_dir).model_dir());
  if (!folder.has_component("transformer_e1")) GTEST_SKIP() << "the set has no E1 weights";
  torch::manual_seed(9);
  const auto source = (torch::rand({48, 64, 3}) * 255).to(torch::kUInt8);
  auto edit_on = [&](const torch::Device& device, const pipeline::HiDreamPlacement& placement) {
    pipeline::HiDreamPipeline pipe(folder, device, torch::kFloat32, "transformer_e1", placement);
    pipeline::HiDreamEdit e;
    e.prompt = "make the sky red";
    e.image = source;
    e.sampling.steps = 3;
    e.sampling.seed = 1234;
    return pipe.edit(e);
  };
  const auto cpu = edit_on(torch::kCPU, {}).image;
  const auto on_npu = edit_on(npu(), {}).image;
  EXPECT_GT(device::sim::reference_op_calls("npu_rms_norm"), 0);  // the fused path ran
  EXPECT_LT((on_npu - cpu).abs().max().item<double>(), 1e-4);
  EXPECT_TRUE(pipeline::to_images(on_npu)[0].rgb == pipeline::to_images(cpu)[0].rgb);

  // The text encoders and the VAE on the host, the transformer alone on the npu: the same
  // image, and each stage reports the device it ran on.
  pipeline::HiDreamPlacement host_stages;
  host_stages.text_device = torch::Device(torch::kCPU);
  host_stages.text_dtype = torch::kFloat32;
  host_stages.vae_device = torch::Device(torch::kCPU);
  const auto split = edit_on(npu(), host_stages);
  EXPECT_LT((split.image - cpu).abs().max().item<double>(), 1e-4);
  EXPECT_TRUE(pipeline::to_images(split.image)[0].rgb == pipeline::to_images(cpu)[0].rgb);
  std::map<std::string, std::string> stage_device;
  for (const auto& m : split.timings.memory) stage_device[m.stage] = m.device;
  EXPECT_EQ(stage_device["text_encode"], "cpu");
  EXPECT_EQ(stage_device["vae_encode"], "cpu");
  EXPECT_EQ(stage_device["denoise"], device::device_name(npu()));
  EXPECT_EQ(stage_device["vae_decode"], "cpu");
}

}  // namespace test_npu_sim_hidream
}  // namespace diffuse
