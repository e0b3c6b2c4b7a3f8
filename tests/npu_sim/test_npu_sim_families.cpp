// SDXL, FLUX.1, FLUX.1 Kontext and Qwen-Image(-Edit) on the simulated npu: every case of their
// golden sets passes there with the device's default (fused) attention, and SDXL's pipelines are
// bit-identical on `cpu` and on the device with the same kernels (as SD 2.x's are: same noise from
// the CPU generator), so the families run on the NPU path, not only on the CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "diffuse/pipeline.h"
#include "npu_sim/sim_fixture.h"
#include "test_util.h"
#include "verify/pipeline_replay.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_npu_sim_families {

using test::SimulatedNpuTest;

bool have(const std::string& dir) {
  return std::filesystem::exists(dir + "/cases.json");
}

void expect_every_case_passes_on(const std::string& dir, const torch::Device& device) {
  const auto set = verify::GoldenSet::load(dir);
  verify::VerifyOptions options;
  options.device = device;
  const auto results = verify::run_all(set, options);
  ASSERT_EQ(results.size(), set.cases.size());
  for (const auto& r : results) EXPECT_TRUE(r.passed) << dir << " " << r.name << ": " << r.reason;
}

TEST_F(SimulatedNpuTest, EverySdxlCasePassesOnTheNpu) {
  if (!have(test::sdxl_golden_dir())) GTEST_SKIP() << "no set at " << test::sdxl_golden_dir();
  expect_every_case_passes_on(test::sdxl_golden_dir(), npu(0));
}

TEST_F(SimulatedNpuTest, EveryFluxCasePassesOnTheNpu) {
  if (!have(test::flux_golden_dir())) GTEST_SKIP() << "no set at " << test::flux_golden_dir();
  expect_every_case_passes_on(test::flux_golden_dir(), npu(0));
}

TEST_F(SimulatedNpuTest, EveryKontextCasePassesOnTheNpu) {
  if (!have(test::flux_kontext_golden_dir()))
    GTEST_SKIP() << "no set at " << test::flux_kontext_golden_dir();
  expect_every_case_passes_on(test::flux_kontext_golden_dir(), npu(0));
}

TEST_F(SimulatedNpuTest, EveryQwenImageCasePassesOnTheNpu) {
  if (!have(test::qwen_image_golden_dir()))
    GTEST_SKIP() << "no set at " << test::qwen_image_golden_dir();
  expect_every_case_passes_on(test::qwen_image_golden_dir(), npu(0));
}

TEST_F(SimulatedNpuTest, SdxlPipelinesAreBitIdenticalOnCpuAndNpu) {
  if (!have(test::sdxl_golden_dir())) GTEST_SKIP() << "no set at " << test::sdxl_golden_dir();
  const auto set = verify::GoldenSet::load(test::sdxl_golden_dir());
  LoadOptions lo;
  lo.dtype = "fp32";
  lo.vae_dtype = "fp32";
  lo.attention = "math";  // the same attention kernel on both devices
  int compared = 0;
  for (const auto& c : set.cases) {
    if (c.component != "pipeline") continue;
    lo.device = "cpu";
    const auto cpu = verify::replay_pipeline_case(set, c, set.model_dir(c), lo);
    lo.device = "npu:0";
    const auto on_npu = verify::replay_pipeline_case(set, c, set.model_dir(c), lo);
    ASSERT_EQ(cpu.result.images.size(), on_npu.result.images.size()) << c.name;
    for (size_t i = 0; i < cpu.result.images.size(); ++i)
      EXPECT_EQ(cpu.result.images[i].rgb, on_npu.result.images[i].rgb) << c.name;
    EXPECT_TRUE(torch::equal(cpu.result.latents, on_npu.result.latents)) << c.name;
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

}  // namespace test_npu_sim_families
}  // namespace diffuse
