#include "device/device.h"

#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>

#include "device/cpu_info.h"
#include "device/cuda_backend.h"
#include "device/npu_backend.h"
#include "diffuse/errors.h"

namespace diffuse::device {
namespace {

std::mutex g_probe_mu;
std::map<std::pair<std::string, int>, bool> g_probe_cache;

void finalize_npu_at_exit() {
  const NpuBackend* b = npu_backend();
  if (b && b->finalize) {
    try {
      b->finalize();
    } catch (const std::exception&) {
      // Nothing useful can be done about a failing driver shutdown at exit.
    }
  }
}

}  // namespace

int64_t cuda_count() {
  return torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
}

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
      if (npu_count() > 0)
        spec = "npu:0";
      else if (cuda_count() > 0)
        spec = "cuda:0";
      else
        spec = "cpu";
    }
  }
  static const std::regex re("^(cpu|cuda|npu)(?::([0-9]+))?$");
  std::smatch m;
  if (!std::regex_match(spec, m, re))
    throw DeviceError("unknown device '" + spec +
                      "' (expected auto, cpu, cuda[:N] or npu[:N]; available here: " +
                      join_list(available_devices()) + ")");
  std::string type = m[1];
  int64_t index = m[2].matched ? std::stoll(m[2]) : 0;
  if (type == "cpu") {
    if (m[2].matched && index != 0)
      throw DeviceError("device 'cpu' has no index " + std::to_string(index));
    return torch::Device(torch::kCPU);
  }
  int64_t count = type == "cuda" ? cuda_count() : npu_count();
  if (count == 0) {
    std::string why =
        type == "cuda" ? "no CUDA device is visible or this libtorch was built without CUDA"
        : npu_backend() != nullptr ? "torch_npu is linked but sees no NPU (check the driver and "
                                     "ASCEND_RT_VISIBLE_DEVICES)"
                                   : "this build has no Ascend support (rebuild with "
                                     "-DDIFFUSE_WITH_TORCH_NPU=ON against torch_npu)";
    throw DeviceError("device '" + spec + "' is not available: " + why +
                      " (available here: " + join_list(available_devices()) + ")");
  }
  if (index >= count)
    throw DeviceError("device '" + spec + "' does not exist: " + std::to_string(count) + " " +
                      type + " device(s) found (available here: " + join_list(available_devices()) +
                      ")");
  if (type == "cuda") {
    cuda::apply_float32_precision();
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return torch::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
}

std::string device_name(const torch::Device& device) {
  switch (device.type()) {
    case c10::DeviceType::CPU:
      return "cpu";
    case c10::DeviceType::CUDA:
      return "cuda:" + std::to_string(device.has_index() ? device.index() : 0);
    case c10::DeviceType::PrivateUse1:
      return "npu:" + std::to_string(device.has_index() ? device.index() : 0);
    default:
      return device.str();
  }
}

std::string join_list(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& x : items) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool cpu_has_native_bf16() {
  const CpuInfo& c = cpu_info();
  return c.avx512_bf16 || c.amx_bf16;
}

bool probe_dtype(const torch::Device& device, torch::Dtype dtype) {
  std::lock_guard<std::mutex> lock(g_probe_mu);
  auto key = std::make_pair(device.str(), static_cast<int>(dtype));
  auto it = g_probe_cache.find(key);
  if (it != g_probe_cache.end()) return it->second;
  bool ok = false;
  try {
    prepare_device(device);
    torch::NoGradGuard no_grad;
    auto opts = torch::TensorOptions().device(device).dtype(dtype);
    auto a = torch::full({8, 8}, 0.5, opts);
    auto x = torch::full({1, 4, 8, 8}, 0.25, opts);
    auto w = torch::full({4, 4, 3, 3}, 0.125, opts);
    auto mm = torch::matmul(a, a).to(torch::kCPU, torch::kFloat32);
    auto cv = torch::conv2d(x, w, {}, 1, 1).to(torch::kCPU, torch::kFloat32);
    auto sm = torch::softmax(a, -1).to(torch::kCPU, torch::kFloat32);
    ok = std::abs(mm[0][0].item<float>() - 2.0f) < 1e-2f &&
         std::abs(cv[0][0][4][4].item<float>() - 1.125f) < 1e-2f &&
         std::abs(sm[0][0].item<float>() - 0.125f) < 1e-3f;
  } catch (const std::exception&) {
    ok = false;
  }
  g_probe_cache[key] = ok;
  return ok;
}

void clear_probe_cache() {
  std::lock_guard<std::mutex> lock(g_probe_mu);
  g_probe_cache.clear();
}

std::string dtype_name(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return "fp32";
    case torch::kBFloat16:
      return "bf16";
    case torch::kFloat16:
      return "fp16";
    case torch::kFloat64:
      return "fp64";
    default:
      return c10::toString(c10::ScalarType(dtype));
  }
}

bool bf16_is_fast(const torch::Device& device) {
  switch (device.type()) {
    case c10::DeviceType::CPU:
      return cpu_has_native_bf16();
    case c10::DeviceType::CUDA: {
      // Ampere (sm80) and later have bf16 tensor cores; without the properties (a CUDA
      // device in a build without CUDA headers cannot happen) assume not.
      cuda::Properties p;
      return cuda::properties(device.has_index() ? device.index() : 0, &p) && p.major >= 8;
    }
    case c10::DeviceType::PrivateUse1: {
      const NpuBackend* b = npu_backend();
      return b && b->capabilities && b->capabilities(device.has_index() ? device.index() : 0).bf16;
    }
    default:
      return false;
  }
}

DtypeSupport dtype_support(const torch::Device& device) {
  DtypeSupport s;
  s.is_cpu = device.is_cpu();
  s.bf16 = probe_dtype(device, torch::kBFloat16);
  s.bf16_fast = s.bf16 && bf16_is_fast(device);
  // fp16 is never chosen on the CPU: skip the probe (its kernels are partial there).
  s.fp16 = !s.is_cpu && probe_dtype(device, torch::kFloat16);
  return s;
}

torch::Dtype choose_dtype(const DtypeSupport& s, const std::string& component) {
  const bool vae = component == "vae";
  if (s.is_cpu) {
    // bf16 only where the CPU does it natively, the VAE included: on the golden pipeline
    // cases a bf16 VAE costs < 0.4 dB PSNR (42.6 dB vs float32) and halves decode time and
    // its memory (`diffuse bench precision`).
    return s.bf16_fast ? torch::kBFloat16 : torch::kFloat32;
  }
  if (s.bf16_fast) return torch::kBFloat16;
  // fp16 overflows in the SD VAE decoder (diffusers upcasts it): fp32 instead.
  if (!vae && s.fp16) return torch::kFloat16;
  return torch::kFloat32;
}

torch::Dtype resolve_dtype(const std::string& spec, const torch::Device& device,
                           const std::string& component) {
  if (spec == "fp32" || spec == "float32" || spec == "f32") return torch::kFloat32;
  if (spec == "bf16" || spec == "bfloat16") {
    // oneDNN has no bf16 convolution below AVX-512 (an AVX2-only CPU): refused here with the
    // reason, instead of failing in the first convolution with "could not create a primitive
    // descriptor iterator".
    if (device.is_cpu() && !probe_dtype(device, torch::kBFloat16))
      throw InvalidArgument(
          "dtype bf16 is not supported on this CPU: its math library (oneDNN) has no bf16 "
          "convolution without AVX-512 (use fp32 or auto)");
    return torch::kBFloat16;
  }
  if (spec == "fp16" || spec == "float16" || spec == "f16" || spec == "half") {
    if (device.is_cpu())
      throw InvalidArgument("dtype fp16 is not supported on cpu (use bf16 or fp32)");
    return torch::kFloat16;
  }
  if (!spec.empty() && spec != "auto")
    throw InvalidArgument("unknown dtype '" + spec + "' (expected auto, fp32, bf16 or fp16)");
  return choose_dtype(dtype_support(device), component);
}

void prepare_device(const torch::Device& device) {
  if (device.type() != c10::DeviceType::PrivateUse1) return;
  static std::mutex mu;
  static std::set<int> ready;
  static bool finalizer_registered = false;
  std::lock_guard<std::mutex> lock(mu);
  int index = device.has_index() ? device.index() : 0;
  if (ready.count(index)) return;
  const NpuBackend* b = npu_backend();
  if (!b)
    throw DeviceError("device '" + device_name(device) + "' has no npu backend in this build");
  if (b->init) {
    try {
      b->init(static_cast<c10::DeviceIndex>(index));
    } catch (const std::exception& e) {
      throw DeviceError("initialising " + device_name(device) + " (" + b->name +
                        ") failed: " + e.what());
    }
    if (b->finalize && !finalizer_registered) {
      std::atexit(finalize_npu_at_exit);
      finalizer_registered = true;
    }
  }
  ready.insert(index);
}

void seed_device_generator(const torch::Device& device, uint64_t seed) {
  if (device.is_cuda()) {
    auto gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  } else if (device.type() == c10::DeviceType::PrivateUse1) {
    const NpuBackend* b = npu_backend();
    if (b && b->manual_seed) b->manual_seed(device.has_index() ? device.index() : 0, seed);
  }
}

}  // namespace diffuse::device
