#include "device/cpu_fallback.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "diffuse/errors.h"

namespace diffuse::device {
namespace {

struct FallbackState {
  std::mutex mu;
  std::vector<FallbackRecord> log;
  std::unique_ptr<torch::Library> library;  // keeps our registration alive
  bool ours = false;
};

FallbackState& state() {
  static FallbackState s;
  return s;
}

// Counts the call; true when this is the operator's first fallback since the last reset.
bool record_call(const std::string& op) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& r : s.log) {
    if (r.op == op) {
      ++r.calls;
      return false;
    }
  }
  s.log.push_back({op, 1});
  return true;
}

void diffuse_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = c10::toString(op.schema().operator_name());
  if (!cpu_fallback_enabled())
    throw DeviceError("operator " + name +
                      " has no kernel for the npu device and the CPU fallback is disabled "
                      "(DIFFUSE_CPU_FALLBACK=0); unset it to run such operators on the CPU");
  if (record_call(name))
    TORCH_WARN("operator ", name,
               " has no kernel for the npu device; it runs on the CPU (inputs copied over, "
               "outputs copied back), which is slow. Set DIFFUSE_CPU_FALLBACK=0 to make this an "
               "error.");
  // libtorch 1.13's at::native::cpu_fallback moves Tensor and Tensor[] arguments only: move
  // Tensor?[] (index's indices, read-only) here, and run factory-style operators whose
  // Device argument names the npu on the CPU, then move their results over.
  const auto& args = op.schema().arguments();
  const size_t begin = stack->size() - args.size();
  c10::optional<c10::Device> target;
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[begin + i];
    if (v.isOptionalTensorList()) {
      auto list = v.toOptionalTensorList();
      c10::List<c10::optional<at::Tensor>> cpu;
      for (const c10::optional<at::Tensor>& t : list) {
        if (t.has_value() && t->defined() && !t->is_cpu())
          cpu.push_back(t->cpu());
        else
          cpu.push_back(t);
      }
      v = c10::IValue(cpu);
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      target = v.toDevice();
      v = c10::IValue(c10::Device(c10::kCPU));
    }
  }
  at::native::cpu_fallback(op, stack);
  if (target) {
    const size_t n = op.schema().returns().size();
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      c10::IValue& r = (*stack)[i];
      if (r.isTensor() && r.toTensor().defined() && r.toTensor().is_cpu())
        r = c10::IValue(r.toTensor().to(*target));
    }
  }
}

}  // namespace

bool cpu_fallback_enabled() {
  const char* v = std::getenv("DIFFUSE_CPU_FALLBACK");
  if (!v) return true;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return !(s == "0" || s == "false" || s == "off" || s == "no");
}

FallbackOwner cpu_fallback_owner() {
  auto& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.ours) return FallbackOwner::kDiffuse;
  }
  return c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(
             c10::DispatchKey::PrivateUse1)
             ? FallbackOwner::kOther
             : FallbackOwner::kNone;
}

FallbackOwner install_cpu_fallback() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.ours) return FallbackOwner::kDiffuse;
  if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::PrivateUse1))
    return FallbackOwner::kOther;
  // TORCH_LIBRARY_IMPL(_, PrivateUse1, m), registered at run time: a static one would clash with
  // torch_npu's, and could be dropped by the linker from a static library.
  s.library = std::make_unique<torch::Library>(torch::Library::IMPL, "_",
                                               c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  s.library->fallback(torch::CppFunction::makeFromBoxedFunction<&diffuse_cpu_fallback>());
  s.ours = true;
  return FallbackOwner::kDiffuse;
}

std::vector<FallbackRecord> cpu_fallback_log() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.log;
}

void reset_cpu_fallback_log() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.log.clear();
}

}  // namespace diffuse::device
