// Device selection: parses auto|cpu|cuda[:N]|npu[:N] (flag or env DIFFUSE_DEVICE), checks the
// device exists, readies it, and picks a dtype per component. Everything above this layer
// speaks only torch::Device and torch::Dtype.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::device {

// Devices this process can use, e.g. {"cpu", "cuda:0"}.
std::vector<std::string> available_devices();
int64_t cuda_count();

// "auto" (or empty) consults DIFFUSE_DEVICE, then prefers npu, cuda, cpu. Throws DeviceError
// listing the available devices when the spec is unknown or the device is absent. npu[:N]
// maps to PrivateUse1 (libtorch 1.13 cannot name that slot "npu").
torch::Device resolve_device(const std::string& spec);

// Human-readable name: "cpu", "cuda:0", "npu:0".
std::string device_name(const torch::Device& device);
// "a, b, c": lists of devices, dtypes and backends in messages and reports.
std::string join_list(const std::vector<std::string>& items);

// Readies a device before its first use (torch_npu::init_npu for npu, with finalize_npu at
// exit). Idempotent; cheap after the first call. Throws DeviceError when the device fails.
void prepare_device(const torch::Device& device);

// Seeds the device's default generator so operators that sample on the device are
// reproducible too. The pipeline's noise never comes from here: it is drawn on the CPU.
// No-op for the CPU (the pipeline uses its own CPU generator, not the global one).
void seed_device_generator(const torch::Device& device, uint64_t seed);

// dtype names: auto|fp32|float32|bf16|bfloat16|fp16|float16. "auto" applies the policy for the
// device: bf16 where supported and fast, else fp16 (never on CPU), else fp32.
// `component` is "unet", "text_encoder" or "vae" (the VAE stays fp32 under auto where only
// fp16 would be available, because fp16 overflows in its decoder).
torch::Dtype resolve_dtype(const std::string& spec, const torch::Device& device,
                           const std::string& component);
std::string dtype_name(torch::Dtype dtype);

// What the dtype policy needs to know about a device.
struct DtypeSupport {
  bool is_cpu = false;
  bool bf16 = false;       // the probe ran in bf16
  bool bf16_fast = false;  // bf16 is native (AMX/AVX512-BF16, sm80+, Ascend A2-class)
  bool fp16 = false;       // the probe ran in fp16
};
DtypeSupport dtype_support(const torch::Device& device);
// The policy itself, separate from probing so it can be tested with any answers.
torch::Dtype choose_dtype(const DtypeSupport& support, const std::string& component);

// Whether a tiny matmul + conv + softmax in `dtype` runs on `device` and gives finite,
// correct-ish results. Cached per (device, dtype).
bool probe_dtype(const torch::Device& device, torch::Dtype dtype);
// Forgets cached probe results (tests that swap the simulated device).
void clear_probe_cache();

// bf16 arithmetic is native and fast on this device.
bool bf16_is_fast(const torch::Device& device);

// CPU has native bf16 dot products (AVX512-BF16 / AMX), where oneDNN makes bf16 fast.
bool cpu_has_native_bf16();

}  // namespace diffuse::device
