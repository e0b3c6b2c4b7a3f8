// The npu device through the simulated backend: parsing and selection, tensors and copies,
// natively simulated operators vs the CPU fallback, memory statistics, dtype policy,
// device initialisation and generator seeding.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "bench/pipeline_bench.h"
#include "device/cpu_fallback.h"
#include "device/device.h"
#include "device/memory.h"
#include "device/npu_backend.h"
#include "diffuse/errors.h"
#include "npu_sim/sim_fixture.h"
#include "cpu_bf16.h"
#include "test_util.h"

namespace diffuse {
namespace test_npu_sim_device {

using test::ScopedEnv;
using test::SimulatedNpuTest;
using test::WarningCapture;

std::string error_of(const std::string& spec) {
  try {
    device::resolve_device(spec);
  } catch (const DeviceError& e) {
    return e.what();
  }
  return "";
}

TEST_F(SimulatedNpuTest, ParsesAndListsNpuDevices) {
  EXPECT_EQ(device::npu_count(), 2);
  auto devs = device::available_devices();
  EXPECT_NE(std::find(devs.begin(), devs.end(), "npu:0"), devs.end());
  EXPECT_NE(std::find(devs.begin(), devs.end(), "npu:1"), devs.end());
  EXPECT_EQ(device::resolve_device("npu"), npu(0));
  EXPECT_EQ(device::resolve_device("npu:1"), npu(1));
  EXPECT_EQ(device::device_name(npu(1)), "npu:1");
  std::string err = error_of("npu:2");
  EXPECT_NE(err.find("2 npu device(s)"), std::string::npos) << err;
  EXPECT_NE(err.find("npu:1"), std::string::npos) << err;  // lists what exists
  EXPECT_NE(error_of("npu:x").find("unknown device"), std::string::npos);
}

TEST_F(SimulatedNpuTest, AutoPrefersNpuAndHonoursEnvironment) {
  ScopedEnv unset("DIFFUSE_DEVICE", nullptr);
  EXPECT_EQ(device::resolve_device("auto"), npu(0));
  ScopedEnv env("DIFFUSE_DEVICE", "npu:1");
  EXPECT_EQ(device::resolve_device(""), npu(1));
  ScopedEnv cpu("DIFFUSE_DEVICE", "cpu");
  EXPECT_TRUE(device::resolve_device("auto").is_cpu());
}

TEST_F(SimulatedNpuTest, DeviceCountFollowsTheBackend) {
  device::sim::SimulatedNpuOptions one;
  one.count = 1;
  device::sim::register_simulated_npu(one);
  EXPECT_EQ(device::npu_count(), 1);
  EXPECT_NE(error_of("npu:1").find("1 npu device(s)"), std::string::npos);
  device::unregister_npu_backend();
  EXPECT_EQ(device::npu_count(), 0);
  EXPECT_NE(error_of("npu").find("no Ascend support"), std::string::npos) << error_of("npu");
}

TEST_F(SimulatedNpuTest, TensorsMoveBetweenDevicesExactly) {
  auto x = torch::randn({3, 5, 7});
  auto on0 = x.to(npu(0));
  EXPECT_EQ(on0.device(), npu(0));
  auto on1 = on0.to(npu(1));
  EXPECT_EQ(on1.device(), npu(1));
  EXPECT_TRUE(torch::equal(on1.cpu(), x));
  // dtype conversion and non-contiguous sources go through the same copy.
  auto bf = x.transpose(0, 2).to(npu(0), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(bf.cpu(), x.transpose(0, 2).to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(torch::zeros({4}, npu(1)).cpu(), torch::zeros({4})));
}

TEST_F(SimulatedNpuTest, ViewsShareDeviceMemory) {
  auto x = torch::arange(24, torch::kFloat32).reshape({2, 3, 4}).to(npu(0));
  auto v = x.transpose(1, 2).select(0, 1);  // a strided view
  EXPECT_EQ(v.device(), npu(0));
  v.mul_(10);  // natively simulated in-place op writes through the view
  auto expected = torch::arange(24, torch::kFloat32).reshape({2, 3, 4});
  expected[1].mul_(10);
  EXPECT_TRUE(torch::equal(x.cpu(), expected));
  EXPECT_TRUE(torch::equal(x.view({6, 4}).cpu(), expected.view({6, 4})));
}

TEST_F(SimulatedNpuTest, NativeOpsRunWithoutFallbackAndMatchCpuBitwise) {
  auto gen = at::detail::createCPUGenerator(3);
  auto a = torch::randn({4, 8}, gen), b = torch::randn({8, 6}, gen), c = torch::randn({4, 8}, gen);
  auto img = torch::randn({1, 3, 9, 9}, gen), w = torch::randn({5, 3, 3, 3}, gen);
  auto da = a.to(npu(0)), db = b.to(npu(0)), dc = c.to(npu(0));
  EXPECT_TRUE(torch::equal((da + dc).cpu(), a + c));
  EXPECT_TRUE(torch::equal((da * dc).cpu(), a * c));
  EXPECT_TRUE(torch::equal(torch::mm(da, db).cpu(), torch::mm(a, b)));
  EXPECT_TRUE(torch::equal(torch::conv2d(img.to(npu(0)), w.to(npu(0)), {}, 1, 1).cpu(),
                           torch::conv2d(img, w, {}, 1, 1)));
  EXPECT_TRUE(torch::equal(torch::softmax(da, -1).cpu(), torch::softmax(a, -1)));
  for (const auto& r : device::cpu_fallback_log()) ADD_FAILURE() << r.op << " fell back to the CPU";
}

TEST_F(SimulatedNpuTest, UnimplementedOpsFallBackToCpuWithOneWarningEach) {
  auto x = torch::linspace(-3, 3, 11);
  auto dx = x.to(npu(0));
  WarningCapture warnings;
  auto s1 = torch::sin(dx);
  auto s2 = torch::sin(dx * 2);
  EXPECT_EQ(s1.device(), npu(0));
  EXPECT_TRUE(torch::equal(s1.cpu(), torch::sin(x)));
  EXPECT_TRUE(torch::equal(s2.cpu(), torch::sin(x * 2)));
  // Structured operators reach the backend as their out= overload (aten::sin.out).
  EXPECT_EQ(fallback_calls("aten::sin"), 2);
  EXPECT_EQ(warnings.count_containing("operator aten::sin"), 1);
  // In-place fallback writes back into the device tensor (via _copy_from_and_resize).
  dx.clamp_(-1, 1);
  EXPECT_TRUE(torch::equal(dx.cpu(), x.clamp(-1, 1)));
  EXPECT_GE(fallback_calls("aten::clamp"), 1);
  // An out= fallback that must resize its (device) output.
  auto out = torch::empty({0}, npu(0));
  torch::cumsum_out(out, x.to(npu(0)), 0);
  EXPECT_EQ(out.device(), npu(0));
  EXPECT_TRUE(torch::equal(out.cpu(), torch::cumsum(x, 0)));
}

TEST_F(SimulatedNpuTest, DisabledFallbackIsAnErrorNamingTheOperator) {
  auto dx = torch::ones({3}).to(npu(0));
  ScopedEnv off("DIFFUSE_CPU_FALLBACK", "0");
  EXPECT_FALSE(device::cpu_fallback_enabled());
  try {
    auto y = torch::cos(dx);
    FAIL() << "cos should not fall back";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::cos"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("DIFFUSE_CPU_FALLBACK"), std::string::npos) << e.what();
  }
  // Natively simulated operators are unaffected.
  EXPECT_TRUE(torch::equal((dx + dx).cpu(), torch::full({3}, 2.0f)));
}

TEST_F(SimulatedNpuTest, OurFallbackOwnsTheDispatchKey) {
  EXPECT_EQ(device::cpu_fallback_owner(), device::FallbackOwner::kDiffuse);
  EXPECT_EQ(device::install_cpu_fallback(), device::FallbackOwner::kDiffuse);  // idempotent
}

TEST_F(SimulatedNpuTest, MemoryStatisticsFollowTheAllocator) {
  auto d = npu(1);
  device::reset_peak_memory(d);
  auto before = device::device_memory(d);
  ASSERT_TRUE(before.has_allocator);
  EXPECT_EQ(before.device, "npu:1");
  EXPECT_GT(before.process.rss_bytes, 0);
  {
    auto big = torch::empty({1024, 1024}, torch::TensorOptions().device(d));  // 4 MiB
    auto during = device::device_memory(d);
    EXPECT_EQ(during.allocator.allocated_bytes - before.allocator.allocated_bytes, 4 << 20);
    EXPECT_GE(during.allocator.peak_allocated_bytes, during.allocator.allocated_bytes);
  }
  auto after = device::device_memory(d);
  EXPECT_EQ(after.allocator.allocated_bytes, before.allocator.allocated_bytes);
  EXPECT_GE(after.allocator.peak_allocated_bytes, before.allocator.allocated_bytes + (4 << 20));
  device::reset_peak_memory(d);
  EXPECT_EQ(device::device_memory(d).allocator.peak_allocated_bytes,
            after.allocator.allocated_bytes);
  auto calls = device::sim::simulated_device_state(1).empty_cache_calls;
  device::empty_cache(d);
  EXPECT_EQ(device::sim::simulated_device_state(1).empty_cache_calls, calls + 1);
  device::empty_cache(torch::kCPU);  // no-op
  EXPECT_FALSE(device::device_memory(torch::kCPU).has_allocator);
}

// `diffuse bench` on an accelerator reports what its tensors held there, per stage; on the CPU
// those figures are 0.
TEST_F(SimulatedNpuTest, PipelineBenchReportsDeviceMemoryPerStage) {
  for (const char* where : {"npu:0", "cpu"}) {
    SCOPED_TRACE(where);
    bench::PipelineBenchOptions o;
    o.arch = "tiny";
    o.load.device = where;
    o.load.dtype = "fp32";
    o.roofline = false;
    const auto r = bench::run_pipeline_bench(o);
    if (std::string(where) == "cpu") {
      EXPECT_EQ(r.device_peak_mb, 0);
      EXPECT_EQ(r.unet_device_peak_mb, 0);
      continue;
    }
    // The networks' weights stay on the device through every stage.
    EXPECT_GT(r.build_device_peak_mb, 0);
    for (double stage :
         {r.text_encoder_device_peak_mb, r.unet_device_peak_mb, r.vae_device_peak_mb})
      EXPECT_GE(stage, r.build_device_peak_mb * 0.5);
    EXPECT_EQ(r.device_peak_mb, std::max({r.build_device_peak_mb, r.text_encoder_device_peak_mb,
                                          r.unet_device_peak_mb, r.vae_device_peak_mb}));
  }
}

TEST_F(SimulatedNpuTest, DtypePolicyProbesTheDevice) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();  // the simulated device runs the CPU's kernels
  auto d = npu(0);
  auto support = device::dtype_support(d);
  EXPECT_FALSE(support.is_cpu);
  EXPECT_TRUE(support.bf16);  // runs (on the CPU kernels behind the simulated device)
  EXPECT_TRUE(support.bf16_fast);
  EXPECT_EQ(device::resolve_dtype("auto", d, "unet"), torch::kBFloat16);
  EXPECT_EQ(device::resolve_dtype("auto", d, "vae"), torch::kBFloat16);
  EXPECT_EQ(device::resolve_dtype("fp16", d, "unet"), torch::kFloat16);  // explicit override
  EXPECT_EQ(device::resolve_dtype("fp32", d, "vae"), torch::kFloat32);

  // A device without native bf16 (310P/910A-like): no fp16 either here (the CPU kernels behind
  // the simulation lack fp16 conv), so the policy falls back to fp32.
  auto caps = device::sim::SimulatedNpuOptions::default_capabilities();
  caps.bf16 = false;
  device::sim::set_simulated_capabilities(caps);
  device::clear_probe_cache();
  support = device::dtype_support(d);
  EXPECT_TRUE(support.bf16);
  EXPECT_FALSE(support.bf16_fast);
  EXPECT_EQ(device::resolve_dtype("auto", d, "unet"),
            support.fp16 ? torch::kFloat16 : torch::kFloat32);
  EXPECT_EQ(device::resolve_dtype("auto", d, "vae"), torch::kFloat32);
}

TEST_F(SimulatedNpuTest, ProbeRunsOnTheDeviceAndIsRemembered) {
  auto d = npu(1);
  auto allocations = device::sim::simulated_device_state(1).allocations;
  EXPECT_TRUE(device::probe_dtype(d, torch::kFloat32));
  auto after_first = device::sim::simulated_device_state(1).allocations;
  EXPECT_GT(after_first, allocations);  // the tiny ops ran on npu:1
  EXPECT_TRUE(device::probe_dtype(d, torch::kFloat32));
  EXPECT_EQ(device::sim::simulated_device_state(1).allocations, after_first);  // cached
}

TEST_F(SimulatedNpuTest, PrepareInitialisesEachDeviceOnceAndSeedReachesTheDevice) {
  auto before = device::sim::simulated_device_state(1).init_calls;
  device::prepare_device(npu(1));
  device::prepare_device(npu(1));
  auto after = device::sim::simulated_device_state(1).init_calls;
  EXPECT_LE(after - before, 1);
  EXPECT_GE(after, 1);
  device::seed_device_generator(npu(0), 987654321);
  EXPECT_TRUE(device::sim::simulated_device_state(0).seeded);
  EXPECT_EQ(device::sim::simulated_device_state(0).seed, 987654321u);
}

TEST_F(SimulatedNpuTest, SamplingOnTheDeviceFollowsTheGivenGenerator) {
  // randn on the device samples through the fallback with the CPU generator it is given.
  auto g1 = at::detail::createCPUGenerator(42), g2 = at::detail::createCPUGenerator(42);
  auto on_device = torch::randn({16}, g1, torch::TensorOptions().device(npu(0)));
  auto on_cpu = torch::randn({16}, g2);
  EXPECT_TRUE(torch::equal(on_device.cpu(), on_cpu));
}

}  // namespace test_npu_sim_device
}  // namespace diffuse
