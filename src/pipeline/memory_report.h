// Per-stage memory of a generation: taken at the end of each stage, and as JSON (CLI --json,
// server job results).
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

#include "diffuse/pipeline.h"

namespace diffuse::pipeline {

// One object per stage: stage, device, rss_bytes, peak_rss_bytes, and the device allocator's
// allocated/peak/reserved bytes where the device has an allocator (CUDA, NPU).
nlohmann::json memory_json(const std::vector<StageMemory>& memory);

// Appends the memory of `where` (device allocator where it has one, process RSS) at the end of
// `stage` to timings->memory.
void record_stage_memory(StageTimings* timings, const char* stage, const torch::Device& where);

}  // namespace diffuse::pipeline
