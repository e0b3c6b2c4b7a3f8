// The `npu` device is whatever backend occupies PyTorch's PrivateUse1 slot: torch_npu when the
// build links it (DIFFUSE_WITH_TORCH_NPU, see torch_npu_backend.cpp), or the simulated device
// the npu-sim tests register. Everything device-specific about that backend goes through this
// table, so the rest of the engine never includes a torch_npu header.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>

#include "device/memory.h"

namespace diffuse::device {

// What a device can do beyond running the aten operators it registered.
struct NpuCapabilities {
  std::string soc_name;                      // e.g. "Ascend910B2", "Ascend310P3"
  bool bf16 = false;                         // bf16 is native and fast (A2/A3 class, not 310P/910A)
  bool fusion_attention = false;             // npu::npu_fusion_attention runs here (A2-class)
  bool prompt_flash_attention = false;       // npu::npu_prompt_flash_attention runs here
  bool prompt_flash_attention_bf16 = false;  // ... also in bf16 (310P: fp16 only)
};

struct NpuBackend {
  std::string name;        // "torch_npu" or "simulated"
  bool simulated = false;  // proves our integration logic only, never Ascend kernels
  std::function<int64_t()> device_count;
  // torch_npu::init_npu(device) before first use; finalize at exit. May be empty.
  std::function<void(c10::DeviceIndex)> init;
  std::function<void()> finalize;
  std::function<NpuCapabilities(c10::DeviceIndex)> capabilities;
  std::function<AllocatorStats(c10::DeviceIndex)> memory_stats;
  std::function<void(c10::DeviceIndex)> reset_peak_memory;
  std::function<void()> empty_cache;
  // Seeds the device's default generator (ops that sample on the device).
  std::function<void(c10::DeviceIndex, uint64_t)> manual_seed;
  // Graph capture (DeviceGraph, --graph): runs `fn` `warmup` times on a side stream, records
  // one call of it and returns what replays the recording (owning it). Empty when the backend
  // cannot capture.
  std::function<std::function<void()>(c10::DeviceIndex, const std::function<void()>& fn,
                                      int warmup)>
      capture_graph;
};

// Installs `backend` as the npu device (replacing any earlier one) and, unless the backend
// brought its own (torch_npu does), the boxed CPU fallback for operators it lacks.
void register_npu_backend(NpuBackend backend);
// Removes the npu backend (tests); the device then no longer resolves.
void unregister_npu_backend();
// The registered backend, or nullptr. The first call registers torch_npu when linked.
const NpuBackend* npu_backend();

// Number of npu devices (0 without a backend).
int64_t npu_count();

// Called once by npu_backend(): registers torch_npu in DIFFUSE_WITH_TORCH_NPU builds, does
// nothing otherwise (defined in torch_npu_backend.cpp).
void register_builtin_npu_backend();

}  // namespace diffuse::device
