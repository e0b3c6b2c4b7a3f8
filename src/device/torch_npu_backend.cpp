// The one file that talks to torch_npu (Ascend). Compiled into every build; its body exists
// only with -DDIFFUSE_WITH_TORCH_NPU=ON (cmake/TorchNpu.cmake), so the default build needs no
// torch_npu header or library. Written to torch_npu's C++ API (torch_npu/csrc/libs/init_npu.h,
// c10_npu::device_count, NPUCachingAllocator, getDefaultNPUGenerator) and CANN's aclrt API;
// see docs/ascend.md for what was and was not verified on hardware.
#include "device/npu_backend.h"

#ifdef DIFFUSE_WITH_TORCH_NPU
#include <cstdlib>
#include <mutex>
#include <string>

#include "device/cpu_fallback.h"
#include "torch_npu/csrc/aten/NPUGeneratorImpl.h"
#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
// init_npu.h rather than torch_npu/torch_npu.h: the latter exists only in the C++-only
// libtorch_npu package (not in the pip wheel's include/) and pulls in generated headers.
#include "torch_npu/csrc/libs/init_npu.h"
// NPUGraph (aclgraph capture through CANN's aclmdlRICapture*) came with torch_npu 2.1's 7.x
// releases; older ones build without --graph on the npu.
#if __has_include("torch_npu/csrc/core/npu/NPUGraph.h")
#include <memory>

#include "torch_npu/csrc/core/npu/NPUGraph.h"
#include "torch_npu/csrc/core/npu/NPUGuard.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#define DIFFUSE_NPU_GRAPHS 1
#endif
#endif

namespace diffuse::device {

#ifdef DIFFUSE_WITH_TORCH_NPU
namespace {

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Capabilities by SoC family. Atlas A2/A3 (Ascend910B*, Ascend910_93*) and Ascend950 have
// native bf16 and run npu_fusion_attention; Atlas inference cards (Ascend310P*) run
// npu_prompt_flash_attention in fp16 only; Ascend910 (first generation) runs neither.
NpuCapabilities capabilities_for(const std::string& soc) {
  NpuCapabilities c;
  c.soc_name = soc;
  bool a2_class = starts_with(soc, "Ascend910B") || starts_with(soc, "Ascend910_93") ||
                  starts_with(soc, "Ascend950");
  c.bf16 = a2_class;
  c.fusion_attention = a2_class;
  c.prompt_flash_attention = a2_class || starts_with(soc, "Ascend310P");
  c.prompt_flash_attention_bf16 = a2_class;
  return c;
}

NpuCapabilities query_capabilities(c10::DeviceIndex) {
  // The SoC is the same for every device of one host; aclrtGetSocName needs an initialised
  // runtime, which prepare_device() guarantees before any caller asks.
  static std::once_flag once;
  static NpuCapabilities caps;
  std::call_once(once, [] {
    const char* soc = aclrtGetSocName();
    caps = capabilities_for(soc ? soc : "");
  });
  return caps;
}

AllocatorStats query_memory(c10::DeviceIndex index) {
  namespace A = c10_npu::NPUCachingAllocator;
  AllocatorStats s;
  auto stats = A::getDeviceStats(index);
  // Index 0 is StatType::AGGREGATE in every torch_npu release.
  s.allocated_bytes = stats.allocated_bytes[0].current;
  s.peak_allocated_bytes = stats.allocated_bytes[0].peak;
  s.reserved_bytes = stats.reserved_bytes[0].current;
  s.peak_reserved_bytes = stats.reserved_bytes[0].peak;
  size_t free_bytes = 0, total_bytes = 0;
  if (aclrtGetMemInfo(ACL_HBM_MEM, &free_bytes, &total_bytes) == ACL_SUCCESS)
    s.total_bytes = static_cast<int64_t>(total_bytes);
  return s;
}

void init_device(c10::DeviceIndex index) {
  // torch_npu's own fallback is registered at load, so ours cannot be; carry our switch over
  // to torch_npu's (honoured by torch_npu releases that have TORCH_NPU_FALLBACK_CPU_DISABLE).
  if (!cpu_fallback_enabled()) ::setenv("TORCH_NPU_FALLBACK_CPU_DISABLE", "1", 0);
  torch_npu::init_npu(index);
}

void seed(c10::DeviceIndex index, uint64_t value) {
  auto gen = at_npu::detail::getDefaultNPUGenerator(index);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(value);
}

#ifdef DIFFUSE_NPU_GRAPHS
// As CUDA graphs are captured (device_graph.h): the warm-up and the capture run on a side
// stream so that nothing else queued lands in the recording; the device is synchronised
// before (the inputs' copies) and after.
std::function<void()> capture_graph(c10::DeviceIndex index, const std::function<void()>& fn,
                                    int warmup) {
  c10_npu::NPUGuard device_guard(index);
  c10_npu::npuSynchronizeDevice();
  auto side = c10_npu::getStreamFromPool(false, index);
  auto graph = std::make_shared<c10_npu::NPUGraph>();
  {
    c10_npu::NPUStreamGuard stream_guard(side);
    for (int i = 0; i < warmup; ++i) fn();
    side.synchronize();
    graph->capture_begin();
    try {
      fn();
    } catch (...) {
      try {
        graph->capture_end();
      } catch (...) {  // the capture was already broken by what fn threw
      }
      throw;
    }
    graph->capture_end();
  }
  c10_npu::npuSynchronizeDevice();
  return [graph] { graph->replay(); };
}
#endif

}  // namespace

void register_builtin_npu_backend() {
  NpuBackend b;
  b.name = "torch_npu";
  b.simulated = false;
  b.device_count = [] { return static_cast<int64_t>(c10_npu::device_count()); };
  b.init = init_device;
  b.finalize = [] { torch_npu::finalize_npu(); };
  b.capabilities = query_capabilities;
  b.memory_stats = query_memory;
  b.reset_peak_memory = [](c10::DeviceIndex index) {
    c10_npu::NPUCachingAllocator::resetPeakStats(index);
  };
  b.empty_cache = [] { c10_npu::NPUCachingAllocator::emptyCache(); };
  b.manual_seed = seed;
#ifdef DIFFUSE_NPU_GRAPHS
  b.capture_graph = capture_graph;
#endif
  register_npu_backend(std::move(b));
}

#else

void register_builtin_npu_backend() {}

#endif

}  // namespace diffuse::device
