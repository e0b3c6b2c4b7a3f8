#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "device/device.h"
#include "device/memory.h"
#include "diffuse/errors.h"

namespace diffuse {
namespace {

// Restores an environment variable when the test ends.
class EnvGuard {
 public:
  explicit EnvGuard(const char* name) : name_(name) {
    const char* v = std::getenv(name);
    if (v) old_ = v;
  }
  ~EnvGuard() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
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
  EXPECT_EQ(device::resolve_dtype("bf16", cpu, "unet"), torch::kBFloat16);
  EXPECT_THROW(device::resolve_dtype("fp16", cpu, "unet"), InvalidArgument);
  EXPECT_THROW(device::resolve_dtype("int8", cpu, "unet"), InvalidArgument);
  EXPECT_EQ(device::resolve_dtype("auto", cpu, "vae"), torch::kFloat32);
  auto unet = device::resolve_dtype("auto", cpu, "unet");
  EXPECT_EQ(unet, device::cpu_has_native_bf16() ? torch::kBFloat16 : torch::kFloat32);
  EXPECT_TRUE(device::probe_dtype(cpu, torch::kFloat32));
}

TEST(Device, MemoryStatsArePlausible) {
  auto before = device::memory_stats();
  EXPECT_GT(before.rss_bytes, 0);
  auto big = torch::ones({64, 1024, 1024}, torch::kFloat32);  // 256 MiB, touched
  auto after = device::memory_stats();
  EXPECT_GE(after.peak_rss_bytes, before.rss_bytes + 200ll * 1024 * 1024);
  EXPECT_GE(after.peak_rss_bytes, after.rss_bytes);
}

}  // namespace
}  // namespace diffuse
