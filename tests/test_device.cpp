#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "cpu_bf16.h"
#include "device/cpu_allocator.h"
#include "device/cpu_fallback.h"
#include "device/cpu_reproducibility.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "device/memory.h"
#include "device/npu_backend.h"
#include "diffuse/errors.h"
#include "test_util.h"

// oneDNN's C API where a libdnnl is linked (LibTorch's, or the int8 GEMM's).
extern "C" int dnnl_get_primitive_cache_capacity(int* capacity) __attribute__((weak));

namespace diffuse {
namespace test_device {

// Restores an environment variable when the test ends.
class EnvGuard {
 public:
  explicit EnvGuard(const char* name) : name_(name) {
    const char* v = std::getenv(name);
    if (v) old_ = v;
  }
  ~EnvGuard() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(Device, CpuAlwaysResolves) {
  EXPECT_EQ(device::resolve_device("cpu"), torch::Device(torch::kCPU));
  EXPECT_EQ(device::resolve_device("cpu:0"), torch::Device(torch::kCPU));
  auto devs = device::available_devices();
  ASSERT_FALSE(devs.empty());
  EXPECT_EQ(devs[0], "cpu");
}

TEST(Device, AutoHonoursEnvironment) {
  EnvGuard g("DIFFUSE_DEVICE");
  ::setenv("DIFFUSE_DEVICE", "cpu", 1);
  EXPECT_EQ(device::resolve_device("auto"), torch::Device(torch::kCPU));
  ::setenv("DIFFUSE_DEVICE", "tpu", 1);
  EXPECT_THROW(device::resolve_device("auto"), DeviceError);
  ::unsetenv("DIFFUSE_DEVICE");
  EXPECT_NO_THROW(device::resolve_device(""));
}

TEST(Device, UnknownOrAbsentDevicesListWhatIsAvailable) {
  for (const char* spec : {"gpu", "cuda:x", "npu:-1", "cpu:1", "CUDA"}) {
    try {
      device::resolve_device(spec);
      FAIL() << spec << " should not resolve";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
    }
  }
  if (!torch::cuda::is_available()) {
    try {
      device::resolve_device("cuda:0");
      FAIL();
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("not available"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(device::resolve_device("npu"), DeviceError);
}

TEST(Device, DtypePolicy) {
  torch::Device cpu(torch::kCPU);
  EXPECT_EQ(device::resolve_dtype("fp32", cpu, "unet"), torch::kFloat32);
  // bf16 where LibTorch runs it here, else refused with the reason (an AVX2-only CPU).
  if (test::cpu_runs_bf16()) {
    EXPECT_EQ(device::resolve_dtype("bf16", cpu, "unet"), torch::kBFloat16);
  } else {
    const auto msg =
        test::expect_throw<InvalidArgument>([&] { device::resolve_dtype("bf16", cpu, "unet"); });
    EXPECT_NE(msg.find("AVX-512"), std::string::npos) << msg;
  }
  EXPECT_THROW(device::resolve_dtype("fp16", cpu, "unet"), InvalidArgument);
  EXPECT_THROW(device::resolve_dtype("int8", cpu, "unet"), InvalidArgument);
  auto unet = device::resolve_dtype("auto", cpu, "unet");
  EXPECT_EQ(unet, device::cpu_has_native_bf16() ? torch::kBFloat16 : torch::kFloat32);
  EXPECT_EQ(device::resolve_dtype("auto", cpu, "vae"), unet);
  EXPECT_TRUE(device::probe_dtype(cpu, torch::kFloat32));
}

TEST(Device, DtypePolicyDecisions) {
  using device::choose_dtype;
  device::DtypeSupport cpu_fast{true, true, true, false}, cpu_slow{true, true, false, false};
  EXPECT_EQ(choose_dtype(cpu_fast, "unet"), torch::kBFloat16);
  EXPECT_EQ(choose_dtype(cpu_fast, "text_encoder"), torch::kBFloat16);
  EXPECT_EQ(choose_dtype(cpu_fast, "vae"), torch::kBFloat16);
  EXPECT_EQ(choose_dtype(cpu_slow, "vae"), torch::kFloat32);
  EXPECT_EQ(choose_dtype(cpu_slow, "unet"), torch::kFloat32);
  // Accelerators: bf16 where native (A2-class NPU, sm80+ GPU), else fp16 (not for the VAE,
  // whose decoder overflows in fp16), else fp32.
  device::DtypeSupport a2{false, true, true, true}, p310{false, false, false, true},
      v100{false, true, false, true}, none{false, false, false, false};
  EXPECT_EQ(choose_dtype(a2, "unet"), torch::kBFloat16);
  EXPECT_EQ(choose_dtype(a2, "vae"), torch::kBFloat16);
  EXPECT_EQ(choose_dtype(p310, "unet"), torch::kFloat16);
  EXPECT_EQ(choose_dtype(p310, "vae"), torch::kFloat32);
  EXPECT_EQ(choose_dtype(v100, "text_encoder"), torch::kFloat16);  // bf16 runs but slowly
  EXPECT_EQ(choose_dtype(v100, "vae"), torch::kFloat32);
  EXPECT_EQ(choose_dtype(none, "unet"), torch::kFloat32);
}

TEST(Device, CpuFallbackSwitch) {
  EnvGuard g("DIFFUSE_CPU_FALLBACK");
  ::unsetenv("DIFFUSE_CPU_FALLBACK");
  EXPECT_TRUE(device::cpu_fallback_enabled());
  for (const char* off : {"0", "false", "OFF", "no"}) {
    ::setenv("DIFFUSE_CPU_FALLBACK", off, 1);
    EXPECT_FALSE(device::cpu_fallback_enabled()) << off;
  }
  ::setenv("DIFFUSE_CPU_FALLBACK", "1", 1);
  EXPECT_TRUE(device::cpu_fallback_enabled());
}

TEST(Device, NoNpuWithoutABackend) {
  if (device::npu_backend() != nullptr) GTEST_SKIP() << "built with torch_npu";
  EXPECT_EQ(device::npu_count(), 0);
  try {
    device::resolve_device("npu:0");
    FAIL();
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("DIFFUSE_WITH_TORCH_NPU"), std::string::npos) << e.what();
  }
  // Without an npu, seeding and memory calls are harmless no-ops for the CPU.
  device::seed_device_generator(torch::kCPU, 1);
  device::reset_peak_memory(torch::kCPU);
  device::empty_cache(torch::kCPU);
  auto m = device::device_memory(torch::kCPU);
  EXPECT_EQ(m.device, "cpu");
  EXPECT_FALSE(m.has_allocator);
  EXPECT_GT(m.process.rss_bytes, 0);
}

// MKL's reproducible mode is asked for once the engine sets up the CPU, and a user's own
// MKL_CBWR is left alone.
TEST(Device, CpuBlasIsAskedForAlignmentIndependentResults) {
  EnvGuard guard("MKL_CBWR");
  ::unsetenv("MKL_CBWR");
  EXPECT_EQ(device::request_reproducible_blas(), "AUTO,STRICT");
  EXPECT_STREQ(std::getenv("MKL_CBWR"), "AUTO,STRICT");
  ::setenv("MKL_CBWR", "COMPATIBLE", 1);
  EXPECT_EQ(device::request_reproducible_blas(), "COMPATIBLE");
  EXPECT_STREQ(std::getenv("MKL_CBWR"), "COMPATIBLE");
}

TEST(Device, SettingUpTheCpuAsksForReproducibleBlas) {
  // The first call of the process sets it (this test may run alone, or after others did).
  const char* before = std::getenv("MKL_CBWR");
  device::configure_cpu_threads();
  const char* after = std::getenv("MKL_CBWR");
  ASSERT_NE(after, nullptr);
  if (!before) {
    EXPECT_STREQ(after, "AUTO,STRICT");
  }
}

TEST(Device, HeapOnHugePagesFollowsTheTunableAndTheKernelMode) {
  EnvGuard g("GLIBC_TUNABLES");
  const std::string mode = device::transparent_huge_pages_mode();
  ::unsetenv("GLIBC_TUNABLES");
  EXPECT_EQ(device::heap_on_huge_pages(), mode == "always") << mode;
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1", 1);
  EXPECT_EQ(device::heap_on_huge_pages(), mode == "always" || mode == "madvise") << mode;
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.check=0:glibc.malloc.hugetlb=2", 1);
  EXPECT_TRUE(device::heap_on_huge_pages());  // hugetlbfs pages: whatever THP says
}

// A trim inside a huge-page heap splits its huge pages for good, so the default keeps freed
// memory there; kAll gives it back anyway.
TEST(Device, EmptyCacheTrimsAHugePageHeapOnlyWhenAskedForAll) {
  if (!device::keep_freed_memory()) GTEST_SKIP() << "the heap policy is off (user tuning)";
  EnvGuard g("GLIBC_TUNABLES");
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=2", 1);     // taken as a huge-page heap
  auto big = torch::ones({int64_t{96} << 20}, torch::kUInt8);  // touched
  auto pin = torch::ones({int64_t{4} << 20}, torch::kUInt8);   // keeps it off the heap's top
  big.reset();
  const int64_t freed = device::memory_stats().rss_bytes;
  device::empty_cache(torch::kCPU);
  const int64_t kept = device::memory_stats().rss_bytes;
  EXPECT_GT(kept, freed - (int64_t{16} << 20)) << "the default trimmed a huge-page heap";
  device::empty_cache(torch::kCPU, device::HeapRelease::kAll);
  const int64_t trimmed = device::memory_stats().rss_bytes;
  EXPECT_LT(trimmed, kept - (int64_t{64} << 20)) << "kAll did not give the freed block back";
  EXPECT_EQ(pin.sum().item<int64_t>(), int64_t{4} << 20);
}

TEST(Device, TrimKeepingHugePagesGivesFreedMemoryBack) {
  if (!device::keep_freed_memory()) GTEST_SKIP() << "the heap policy is off (user tuning)";
  EnvGuard g("GLIBC_TUNABLES");
  ::unsetenv("GLIBC_TUNABLES");
  auto big = torch::ones({int64_t{96} << 20}, torch::kUInt8);
  auto pin = torch::ones({int64_t{4} << 20}, torch::kUInt8);
  big.reset();
  const int64_t freed = device::memory_stats().rss_bytes;
  if (!device::trim_heap_keeping_huge_pages()) GTEST_SKIP() << "the kernel cannot collapse";
  // Rebuilding split huge pages makes their free parts resident again: 2 MiB at most each.
  EXPECT_LT(device::memory_stats().rss_bytes, freed - (int64_t{64} << 20));
  EXPECT_EQ(pin.sum().item<int64_t>(), int64_t{4} << 20);
}

// Outside a LargeBuffersReturnedWhenFreed scope the heap keeps a large freed buffer for reuse;
// one freed inside is back with the OS once the (outermost) scope ends, whether it was mapped or
// reused a chunk an earlier test freed.
TEST(Device, LargeBuffersOfAOncePerImageStageGoBackWhenFreed) {
  if (!device::keep_freed_memory()) GTEST_SKIP() << "the heap policy is off (user tuning)";
  const int64_t big = int64_t{96} << 20, pin_bytes = int64_t{4} << 20;
  auto rss = [] { return device::memory_stats().rss_bytes; };
  {
    auto kept = torch::ones({big}, torch::kUInt8);
    auto pin = torch::ones({pin_bytes}, torch::kUInt8);  // keeps it off the heap's top
    const int64_t before = rss();
    kept.reset();
    EXPECT_GT(rss(), before - (int64_t{16} << 20)) << "the heap gave a freed buffer back";
    EXPECT_EQ(pin.sum().item<int64_t>(), pin_bytes);
  }
  torch::Tensor pin;
  int64_t before = 0;
  {
    device::LargeBuffersReturnedWhenFreed scope;
    {
      device::LargeBuffersReturnedWhenFreed nested;
      auto returned = torch::ones({big}, torch::kUInt8);
      pin = torch::ones({pin_bytes}, torch::kUInt8);
      before = rss();
      returned.reset();
    }
  }
  EXPECT_LT(rss(), before - (int64_t{64} << 20)) << "a large buffer freed in the scope stayed";
  EXPECT_EQ(pin.sum().item<int64_t>(), pin_bytes);
}

// oneDNN's primitive cache is bounded (a real-size HiDream step grew it by 1.7 GiB otherwise),
// in the linked libdnnl and for oneDNN copies that read the variable later.
TEST(Device, OneDnnPrimitiveCacheIsBounded) {
  device::set_cpu_memory_policy();
  const int capacity = device::bound_onednn_primitive_cache();
  if (capacity < 0) GTEST_SKIP() << "the user set the oneDNN cache capacity";
  EXPECT_EQ(capacity, 64);
  const char* env = std::getenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY");
  ASSERT_NE(env, nullptr);
  EXPECT_EQ(std::string(env), "64");
  if (dnnl_get_primitive_cache_capacity) {
    int linked = -1;
    EXPECT_EQ(dnnl_get_primitive_cache_capacity(&linked), 0);
    EXPECT_EQ(linked, 64);
  }
}

TEST(Device, MemoryStatsArePlausible) {
  auto before = device::memory_stats();
  EXPECT_GT(before.rss_bytes, 0);
  auto big = torch::ones({64, 1024, 1024}, torch::kFloat32);  // 256 MiB, touched
  auto after = device::memory_stats();
  EXPECT_GE(after.peak_rss_bytes, before.rss_bytes + 200ll * 1024 * 1024);
  EXPECT_GE(after.peak_rss_bytes, after.rss_bytes);
}

}  // namespace test_device
}  // namespace diffuse
