#include "device/device.h"

#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>

#include "diffuse/errors.h"

namespace diffuse::device {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

int64_t cuda_count() { return torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0; }

// The npu device exists only when torch_npu is linked (DIFFUSE_WITH_TORCH_NPU) and registered
// itself as PyTorch's PrivateUse1 backend; that hook-up comes with the Ascend build.
int64_t npu_count() { return 0; }

}  // namespace

std::vector<std::string> available_devices() {
  std::vector<std::string> out{"cpu"};
  for (int64_t i = 0; i < cuda_count(); ++i) out.push_back("cuda:" + std::to_string(i));
  for (int64_t i = 0; i < npu_count(); ++i) out.push_back("npu:" + std::to_string(i));
  return out;
}

torch::Device resolve_device(const std::string& spec_in) {
  std::string spec = spec_in;
  if (spec.empty() || spec == "auto") {
    const char* env = std::getenv("DIFFUSE_DEVICE");
    if (env && *env && std::string(env) != "auto") {
      spec = env;
    } else {
      if (npu_count() > 0) spec = "npu:0";
      else if (cuda_count() > 0) spec = "cuda:0";
      else spec = "cpu";
    }
  }
  static const std::regex re("^(cpu|cuda|npu)(?::([0-9]+))?$");
  std::smatch m;
  if (!std::regex_match(spec, m, re))
    throw DeviceError("unknown device '" + spec + "' (expected auto, cpu, cuda[:N] or npu[:N]; available here: " +
                      join(available_devices()) + ")");
  std::string type = m[1];
  int64_t index = m[2].matched ? std::stoll(m[2]) : 0;
  if (type == "cpu") {
    if (m[2].matched && index != 0) throw DeviceError("device 'cpu' has no index " + std::to_string(index));
    return torch::Device(torch::kCPU);
  }
  int64_t count = type == "cuda" ? cuda_count() : npu_count();
  if (count == 0) {
    std::string why = type == "cuda" ? "no CUDA device is visible or this libtorch was built without CUDA"
                                     : "this build has no Ascend support (rebuild with -DDIFFUSE_WITH_TORCH_NPU=ON "
                                       "against torch_npu) or no NPU is visible";
    throw DeviceError("device '" + spec + "' is not available: " + why + " (available here: " +
                      join(available_devices()) + ")");
  }
  if (index >= count)
    throw DeviceError("device '" + spec + "' does not exist: " + std::to_string(count) + " " + type +
                      " device(s) found (available here: " + join(available_devices()) + ")");
  if (type == "cuda") return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  return torch::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
}

std::string device_name(const torch::Device& device) {
  switch (device.type()) {
    case c10::DeviceType::CPU: return "cpu";
    case c10::DeviceType::CUDA: return "cuda:" + std::to_string(device.has_index() ? device.index() : 0);
    case c10::DeviceType::PrivateUse1: return "npu:" + std::to_string(device.has_index() ? device.index() : 0);
    default: return device.str();
  }
}

bool cpu_has_native_bf16() {
  static const bool has = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("flags", 0) == 0)
        return line.find(" avx512_bf16") != std::string::npos || line.find(" amx_bf16") != std::string::npos;
    }
    return false;
  }();
  return has;
}

bool probe_dtype(const torch::Device& device, torch::Dtype dtype) {
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, bool> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(device.str(), static_cast<int>(dtype));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  bool ok = false;
  try {
    torch::NoGradGuard no_grad;
    auto opts = torch::TensorOptions().device(device).dtype(dtype);
    auto a = torch::full({8, 8}, 0.5, opts);
    auto x = torch::full({1, 4, 8, 8}, 0.25, opts);
    auto w = torch::full({4, 4, 3, 3}, 0.125, opts);
    auto mm = torch::matmul(a, a).to(torch::kCPU, torch::kFloat32);
    auto cv = torch::conv2d(x, w, {}, 1, 1).to(torch::kCPU, torch::kFloat32);
    auto sm = torch::softmax(a, -1).to(torch::kCPU, torch::kFloat32);
    ok = std::abs(mm[0][0].item<float>() - 2.0f) < 1e-2f && std::abs(cv[0][0][4][4].item<float>() - 1.125f) < 1e-2f &&
         std::abs(sm[0][0].item<float>() - 0.125f) < 1e-3f;
  } catch (const std::exception&) {
    ok = false;
  }
  cache[key] = ok;
  return ok;
}

std::string dtype_name(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32: return "fp32";
    case torch::kBFloat16: return "bf16";
    case torch::kFloat16: return "fp16";
    case torch::kFloat64: return "fp64";
    default: return c10::toString(c10::ScalarType(dtype));
  }
}

torch::Dtype resolve_dtype(const std::string& spec, const torch::Device& device, const std::string& component) {
  if (spec == "fp32" || spec == "float32" || spec == "f32") return torch::kFloat32;
  if (spec == "bf16" || spec == "bfloat16") return torch::kBFloat16;
  if (spec == "fp16" || spec == "float16" || spec == "f16" || spec == "half") {
    if (device.is_cpu()) throw InvalidArgument("dtype fp16 is not supported on cpu (use bf16 or fp32)");
    return torch::kFloat16;
  }
  if (!spec.empty() && spec != "auto")
    throw InvalidArgument("unknown dtype '" + spec + "' (expected auto, fp32, bf16 or fp16)");
  if (device.is_cpu()) {
    // The VAE decoder is sensitive to bf16 rounding in its last layers; it stays fp32 on CPU
    // unless asked. UNet and text encoder use bf16 only where the CPU does it natively.
    if (component == "vae") return torch::kFloat32;
    return cpu_has_native_bf16() && probe_dtype(device, torch::kBFloat16) ? torch::kBFloat16 : torch::kFloat32;
  }
  if (probe_dtype(device, torch::kBFloat16)) return torch::kBFloat16;
  if (component != "vae" && probe_dtype(device, torch::kFloat16)) return torch::kFloat16;
  return torch::kFloat32;
}

}  // namespace diffuse::device
