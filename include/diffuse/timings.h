// Seconds and memory of a generation, per stage: what every job of the public APIs reports.
// No LibTorch types, so that headers without LibTorch (diffuse/engine.h) can carry it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "diffuse/cpu_share.h"

namespace diffuse {

// Memory after one stage of a generation, on the device the stage ran on.
struct StageMemory {
  std::string stage;   // "text_encode", "vae_encode", "denoise", "vae_decode"
  std::string device;  // "cpu", "cuda:0", "npu:0"
  // Device allocator (CUDA / NPU caching allocator): bytes held by tensors at the end of the
  // stage, the peak during the stage, and bytes reserved. -1 where the device has none (CPU).
  int64_t allocated_bytes = -1;
  int64_t peak_allocated_bytes = -1;
  int64_t reserved_bytes = -1;
  int64_t rss_bytes = 0;       // process resident memory at the end of the stage
  int64_t peak_rss_bytes = 0;  // process peak resident memory so far
};

struct StageTimings {
  double load_s = 0;
  double text_encode_s = 0;
  double vae_encode_s = 0;
  double denoise_s = 0;
  double vae_decode_s = 0;
  double lora_s = 0;  // applying GenerationConfig::loras (0 when they did not change)
  double total_s = 0;
  std::vector<double> step_s;
  int64_t peak_rss_bytes = 0;
  std::vector<StageMemory> memory;  // one entry per stage that ran, in order
  // The CPU threads of the denoising loop and what other processes took meanwhile.
  CpuShare cpu;
  // The memory plan the run followed ("plan: text encoders one at a time ..."); empty for
  // pipelines that do not plan.
  std::string plan;
};

}  // namespace diffuse
