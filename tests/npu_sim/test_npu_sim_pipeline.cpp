// The Stable Diffusion pipeline on the simulated npu: every golden pipeline case gives
// bit-identical intermediates and images on `cpu` and on the simulated device (same kernels,
// same noise drawn on the CPU generator), passes the golden tolerances with the device's
// default (fused) attention, and runs with its components split over devices.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cpu_bf16.h"
#include "diffuse/pipeline.h"
#include "npu_sim/sim_fixture.h"
#include "test_util.h"
#include "verify/pipeline_replay.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_npu_sim_pipeline {

using test::SimulatedNpuTest;

std::vector<const verify::GoldenCase*> pipeline_cases(const verify::GoldenSet& set) {
  std::vector<const verify::GoldenCase*> out;
  for (const auto& c : set.cases)
    if (c.component == "pipeline") out.push_back(&c);
  return out;
}

LoadOptions fp32_on(const std::string& device) {
  LoadOptions lo;
  lo.device = device;
  lo.dtype = "fp32";
  lo.vae_dtype = "fp32";
  lo.attention = "math";  // the same attention kernel on both devices: bitwise comparable
  return lo;
}

void expect_bitwise_equal(const verify::PipelineReplay& cpu, const verify::PipelineReplay& npu,
                          const std::string& what) {
  ASSERT_FALSE(cpu.traced.empty());
  EXPECT_EQ(cpu.traced.size(), npu.traced.size()) << what;
  for (const auto& [name, expected] : cpu.traced) {
    auto it = npu.traced.find(name);
    ASSERT_NE(it, npu.traced.end()) << what << ": " << name << " not traced on npu";
    EXPECT_EQ(it->second.scalar_type(), expected.scalar_type()) << what << ": " << name;
    EXPECT_TRUE(torch::equal(it->second, expected))
        << what << ": " << name << " differs, max |diff| "
        << (it->second.to(torch::kFloat64) - expected.to(torch::kFloat64))
               .abs()
               .max()
               .item<double>();
  }
  ASSERT_EQ(cpu.result.images.size(), npu.result.images.size());
  for (size_t i = 0; i < cpu.result.images.size(); ++i)
    EXPECT_EQ(cpu.result.images[i].rgb, npu.result.images[i].rgb) << what << ": image " << i;
}

TEST_F(SimulatedNpuTest, GoldenPipelineCasesAreBitIdenticalOnCpuAndNpu) {
  auto set = verify::GoldenSet::load(test::golden_dir());
  auto cases = pipeline_cases(set);
  if (cases.empty()) GTEST_SKIP() << "the golden set has no pipeline case";
  for (const auto* c : cases) {
    auto cpu = verify::replay_pipeline_case(set, *c, set.model_dir(*c), fp32_on("cpu"));
    auto npu = verify::replay_pipeline_case(set, *c, set.model_dir(*c), fp32_on("npu:0"));
    expect_bitwise_equal(cpu, npu, c->name);
    // The work really ran on the device: its memory was used and it fell back for some ops.
    bool on_npu = false;
    for (const auto& m : npu.result.timings.memory)
      on_npu |= m.device == "npu:0" && m.peak_allocated_bytes > 0;
    EXPECT_TRUE(on_npu) << c->name;
  }
}

TEST_F(SimulatedNpuTest, GoldenPipelineCasesPassOnNpuWithFusedAttention) {
  auto set = verify::GoldenSet::load(test::golden_dir());
  auto cases = pipeline_cases(set);
  if (cases.empty()) GTEST_SKIP() << "the golden set has no pipeline case";
  verify::VerifyOptions options;
  options.device = npu(0);
  for (const auto* c : cases) {
    device::sim::reset_fused_attention_calls();
    auto r = verify::run_case(set, *c, options);
    EXPECT_TRUE(r.passed) << c->name << ": " << r.reason;
    EXPECT_FALSE(device::sim::fused_attention_calls().empty())
        << c->name << ": fused attention not used";
  }
}

TEST_F(SimulatedNpuTest, SameSeedGivesTheSameImageOnCpuAndNpu) {
  auto set = verify::GoldenSet::load(test::golden_dir());
  GenerationConfig g;
  g.prompts = {"a red cube on a table"};
  g.negative_prompts = {"blurry"};
  g.steps = 3;
  g.seed = 20240607;
  g.scheduler = "euler_a";  // ancestral: draws step noise too
  auto cpu = Text2Image::load(set.model_dir(), fp32_on("cpu")).generate(g);
  auto npu = Text2Image::load(set.model_dir(), fp32_on("npu:1")).generate(g);
  ASSERT_EQ(cpu.images.size(), 1u);
  EXPECT_EQ(cpu.images[0].rgb, npu.images[0].rgb);
  EXPECT_TRUE(torch::equal(cpu.latents, npu.latents));
  EXPECT_EQ(npu.seed, 20240607u);
  // The device generator was seeded with the generation's seed.
  auto state = device::sim::simulated_device_state(1);
  EXPECT_TRUE(state.seeded);
  EXPECT_EQ(state.seed, 20240607u);
}

// --graph on the npu takes the device-graph path (torch_npu's NPUGraph on Ascend; the simulated
// device replays by running the call again): one capture for the generation, a replay per
// UNet call, the image bit-identical to the eager run's. A backend that cannot capture refuses it.
TEST_F(SimulatedNpuTest, GraphReplayOfTheUNetStepMatchesEagerOnTheNpu) {
  auto set = verify::GoldenSet::load(test::golden_dir());
  auto pipe = Text2Image::load(set.model_dir(), fp32_on("npu:0"));
  GenerationConfig g;
  g.prompts = {"a red cube on a table"};
  g.steps = 3;
  g.seed = 11;
  const auto eager = pipe.generate(g);
  const auto before = device::sim::simulated_device_state(0);
  g.cuda_graph = true;
  const auto replayed = pipe.generate(g);
  const auto after = device::sim::simulated_device_state(0);
  EXPECT_EQ(after.graph_captures - before.graph_captures, 1);
  // Every UNet call, the captured one's included, is a replay (at least one per step; the
  // folder's scheduler may call the UNet more than once a step).
  EXPECT_GE(after.graph_replays - before.graph_replays, g.steps);
  EXPECT_TRUE(torch::equal(eager.latents, replayed.latents));
  EXPECT_EQ(eager.images[0].rgb, replayed.images[0].rgb);

  auto backend = *device::npu_backend();
  backend.capture_graph = nullptr;
  device::register_npu_backend(backend);
  const auto msg = test::expect_throw<InvalidArgument>([&] { pipe.generate(g); });
  EXPECT_NE(msg.find("the simulated npu backend cannot capture graphs"), std::string::npos) << msg;
  device::sim::register_simulated_npu();
}

TEST_F(SimulatedNpuTest, ComponentsPlacedOnDifferentDevices) {
  auto set = verify::GoldenSet::load(test::golden_dir());
  auto lo = fp32_on("npu:0");
  lo.text_encoder_device = "cpu";
  lo.vae_device = "npu:1";
  auto split = Text2Image::load(set.model_dir(), lo);
  EXPECT_EQ(split.info().device, "npu:0");
  EXPECT_EQ(split.info().text_encoder_device, "cpu");
  EXPECT_EQ(split.info().vae_device, "npu:1");
  GenerationConfig g;
  g.prompts = {"a lighthouse at dusk"};
  g.steps = 2;
  g.seed = 5;
  auto got = split.generate(g);
  auto expected = Text2Image::load(set.model_dir(), fp32_on("cpu")).generate(g);
  EXPECT_EQ(got.images[0].rgb, expected.images[0].rgb);

  // The memory report names each stage's device; accelerators report allocator statistics.
  std::map<std::string, StageMemory> by_stage;
  for (const auto& m : got.timings.memory) by_stage[m.stage] = m;
  ASSERT_EQ(by_stage.count("text_encode"), 1u);
  ASSERT_EQ(by_stage.count("denoise"), 1u);
  ASSERT_EQ(by_stage.count("vae_decode"), 1u);
  EXPECT_EQ(by_stage["text_encode"].device, "cpu");
  EXPECT_EQ(by_stage["text_encode"].allocated_bytes, -1);
  EXPECT_EQ(by_stage["denoise"].device, "npu:0");
  EXPECT_GT(by_stage["denoise"].peak_allocated_bytes, 0);
  EXPECT_EQ(by_stage["vae_decode"].device, "npu:1");
  EXPECT_GT(by_stage["vae_decode"].peak_allocated_bytes, 0);
  EXPECT_GT(by_stage["vae_decode"].rss_bytes, 0);

  // img2img splits the same way (VAE encode on npu:1, denoising on npu:0).
  auto i2i_split = Image2Image::load(set.model_dir(), lo);
  auto i2i_cpu = Image2Image::load(set.model_dir(), fp32_on("cpu"));
  Image init = got.images[0];
  g.strength = 0.5;
  auto a = i2i_split.generate(g, init);
  auto b = i2i_cpu.generate(g, init);
  EXPECT_EQ(a.images[0].rgb, b.images[0].rgb);
  bool saw_encode = false;
  for (const auto& m : a.timings.memory)
    saw_encode |= m.stage == "vae_encode" && m.device == "npu:1";
  EXPECT_TRUE(saw_encode);
}

TEST_F(SimulatedNpuTest, DefaultDtypePolicyOnTheNpuRuns) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();  // the simulated device runs the CPU's kernels
  auto set = verify::GoldenSet::load(test::golden_dir());
  LoadOptions lo;
  lo.device = "npu:0";
  auto pipe = Text2Image::load(set.model_dir(), lo);
  EXPECT_EQ(pipe.info().unet_dtype, "bf16");  // the simulated device claims native bf16
  EXPECT_EQ(pipe.info().vae_dtype, "bf16");
  GenerationConfig g;
  g.prompts = {"a cat"};
  g.steps = 2;
  g.seed = 1;
  auto r = pipe.generate(g);
  EXPECT_TRUE(torch::isfinite(r.images_float).all().item<bool>());
}

}  // namespace test_npu_sim_pipeline
}  // namespace diffuse
