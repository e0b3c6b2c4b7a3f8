// Device selection: parses auto|cpu|cuda[:N]|npu[:N] (flag or env DIFFUSE_DEVICE), checks the
// device exists, and picks a dtype per component. Everything above this layer speaks only
// torch::Device and torch::Dtype.
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

namespace diffuse::device {

// Devices this process can use, e.g. {"cpu", "cuda:0"}.
std::vector<std::string> available_devices();

// "auto" (or empty) consults DIFFUSE_DEVICE, then prefers npu, cuda, cpu. Throws DeviceError
// listing the available devices when the spec is unknown or the device is absent.
torch::Device resolve_device(const std::string& spec);

// Human-readable name: "cpu", "cuda:0", "npu:0".
std::string device_name(const torch::Device& device);

// dtype names: auto|fp32|float32|bf16|bfloat16|fp16|float16. "auto" applies the policy for the
// device: bf16 where supported and fast, else fp16 (never on CPU), else fp32.
// `component` is "unet", "text_encoder" or "vae" (the VAE stays fp32 under auto on devices
// where fp16 overflows it).
torch::Dtype resolve_dtype(const std::string& spec, const torch::Device& device, const std::string& component);
std::string dtype_name(torch::Dtype dtype);

// Whether a tiny matmul + conv in `dtype` runs on `device` and gives finite, correct-ish
// results. Cached per (device, dtype).
bool probe_dtype(const torch::Device& device, torch::Dtype dtype);

// CPU has native bf16 dot products (AVX512-BF16 / AMX), where oneDNN makes bf16 fast.
bool cpu_has_native_bf16();

}  // namespace diffuse::device
