// A simulated NPU for CI: a test-only accelerator in PyTorch's PrivateUse1 slot (the slot
// torch_npu occupies), backed by CPU memory. It exercises OUR integration logic — device
// parsing and placement, the dtype policy, generator seeding, the CPU fallback, memory
// statistics and the fused-attention call path — and proves nothing about Ascend kernels.
//
// What it registers for PrivateUse1:
//  - an allocator (malloc'd host memory, counted per device for memory statistics),
//  - a DeviceGuardImpl with `count` devices,
//  - factory and copy kernels (empty.memory_format, empty_strided, _copy_from,
//    _copy_from_and_resize, resize_) and the view kernels (view, as_strided, _reshape_alias,
//    unfold), which only set metadata,
//  - a SUBSET of compute operators (kSimulatedNativeOps) that run the CPU kernel on the very
//    same memory; every other operator reaches diffuse's CPU fallback (copy in, run, copy out),
//  - the diffuse npu backend table ("simulated"), which makes npu_count() report the devices.
// Only built into diffuse_npu_sim_tests (never into the library or the CLI), and only when
// torch_npu is not linked (both would claim PrivateUse1).
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "device/npu_backend.h"

namespace diffuse::device::sim {

struct SimulatedNpuOptions {
  int64_t count = 2;
  NpuCapabilities capabilities = default_capabilities();

  static NpuCapabilities default_capabilities() {
    NpuCapabilities c;
    c.soc_name = "SimulatedNPU (host memory, CPU kernels)";
    c.bf16 = true;
    c.fusion_attention = true;
    c.prompt_flash_attention = true;
    c.prompt_flash_attention_bf16 = true;
    return c;
  }
};

// Registers the simulated device (kernels once per process; the backend table every call, so
// tests can change count and capabilities). Throws if torch_npu or another PrivateUse1 backend
// is already present.
void register_simulated_npu(const SimulatedNpuOptions& options = {});
// Changes what the registered simulated device claims to support.
void set_simulated_capabilities(const NpuCapabilities& capabilities);

// aten operators the simulated device implements natively (on shared memory).
const std::vector<std::string>& simulated_native_ops();

struct SimulatedDeviceState {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t allocations = 0;  // allocator calls
  int64_t init_calls = 0;   // backend init (torch_npu::init_npu stand-in)
  int64_t empty_cache_calls = 0;
  int64_t graph_captures = 0;  // capture_graph calls (every device)
  int64_t graph_replays = 0;
  bool seeded = false;
  uint64_t seed = 0;  // last manual_seed
};
SimulatedDeviceState simulated_device_state(c10::DeviceIndex index);

// Reference implementations of torch_npu's fused attention operators, registered under their
// real names and schemas (npu::npu_fusion_attention, npu::npu_prompt_flash_attention) for the
// simulated device. They honour input_layout, scale, atten_mask (true = masked out),
// pre/next token windows and return garbage in every output but the documented one, so a
// wrong call from diffuse gives a wrong answer.
void register_reference_npu_attention_ops();

// Reference npu_rms_norm, npu_rotary_mul and npu_grouped_matmul (HiDream's fused pieces).
void register_reference_npu_hidream_ops();
// Calls of those since the last reset: "npu_rms_norm", "npu_rotary_mul:<mode>",
// "npu_grouped_matmul".
int64_t reference_op_calls(const std::string& op);
void reset_reference_op_calls();

// Makes the reference operators throw after recording the call (a failing kernel).
void set_reference_ops_fail(bool fail);

struct FusedAttentionCall {
  std::string op;  // "npu_fusion_attention" / "npu_prompt_flash_attention"
  std::string input_layout;
  int64_t heads = 0;
  double scale = 0;
  bool has_mask = false;
  int64_t pre_tokens = 0, next_tokens = 0;
  std::string dtype;
};
// Calls since the last reset, in order.
std::vector<FusedAttentionCall> fused_attention_calls();
void reset_fused_attention_calls();

}  // namespace diffuse::device::sim
