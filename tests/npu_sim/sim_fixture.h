// Test fixture for the npu-sim tests: a fresh simulated npu (2 devices, default
// capabilities) for every test, with probe caches and logs reset.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "device/cpu_fallback.h"
#include "device/device.h"
#include "nn/attention.h"
#include "nn/attention_npu.h"
#include "npu_sim/simulated_npu.h"

namespace diffuse::test {

// Sets (or unsets) an environment variable for the lifetime of the guard.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class SimulatedNpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device::sim::register_simulated_npu({});
    device::sim::register_reference_npu_attention_ops();
    nn::register_npu_attention_backend();
    device::clear_probe_cache();
    device::reset_cpu_fallback_log();
    device::sim::reset_fused_attention_calls();
    nn::reset_npu_attention_failures();
    nn::set_default_attention_backend(nn::AttentionBackend::kAuto);
  }
  void TearDown() override { nn::set_default_attention_backend(nn::AttentionBackend::kAuto); }

  static torch::Device npu(int index = 0) {
    return torch::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
  }
  // Fallback calls of `op` in any overload ("aten::sin" counts aten::sin.out too).
  static int64_t fallback_calls(const std::string& op) {
    int64_t n = 0;
    for (const auto& r : device::cpu_fallback_log())
      if (r.op == op || r.op.rfind(op + ".", 0) == 0 || r.op.rfind(op + "_", 0) == 0) n += r.calls;
    return n;
  }
};

// Collects c10 warnings (TORCH_WARN) of this thread while alive.
class WarningCapture : public c10::WarningHandler {
 public:
#if TORCH_VERSION_MAJOR >= 2
  WarningCapture() : previous_(c10::WarningUtils::get_warning_handler()) {
    c10::WarningUtils::set_warning_handler(this);
  }
  ~WarningCapture() override {
    c10::WarningUtils::set_warning_handler(previous_);
  }
  void process(const c10::Warning& warning) override {
    messages.push_back(warning.msg());
  }
#else
  WarningCapture() : previous_(c10::Warning::get_warning_handler()) {
    c10::Warning::set_warning_handler(this);
  }
  ~WarningCapture() override {
    c10::Warning::set_warning_handler(previous_);
  }
  void process(const c10::SourceLocation&, const std::string& msg, const bool) override {
    messages.push_back(msg);
  }
#endif
  int count_containing(const std::string& text) const {
    int n = 0;
    for (const auto& m : messages) n += m.find(text) != std::string::npos;
    return n;
  }
  std::vector<std::string> messages;

 private:
  c10::WarningHandler* previous_;
};

}  // namespace diffuse::test
