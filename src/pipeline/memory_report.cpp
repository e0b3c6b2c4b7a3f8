#include "pipeline/memory_report.h"

#include "device/memory.h"

namespace diffuse::pipeline {

nlohmann::json memory_json(const std::vector<StageMemory>& memory) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : memory) {
    nlohmann::json j = {{"stage", m.stage},
                        {"device", m.device},
                        {"rss_bytes", m.rss_bytes},
                        {"peak_rss_bytes", m.peak_rss_bytes}};
    if (m.allocated_bytes >= 0) {
      j["allocated_bytes"] = m.allocated_bytes;
      j["peak_allocated_bytes"] = m.peak_allocated_bytes;
      j["reserved_bytes"] = m.reserved_bytes;
    }
    out.push_back(j);
  }
  return out;
}

void record_stage_memory(StageTimings* timings, const char* stage, const torch::Device& where) {
  auto m = device::device_memory(where);
  StageMemory s;
  s.stage = stage;
  s.device = m.device;
  if (m.has_allocator) {
    s.allocated_bytes = m.allocator.allocated_bytes;
    s.peak_allocated_bytes = m.allocator.peak_allocated_bytes;
    s.reserved_bytes = m.allocator.reserved_bytes;
  }
  s.rss_bytes = m.process.rss_bytes;
  s.peak_rss_bytes = m.process.peak_rss_bytes;
  timings->memory.push_back(std::move(s));
}

}  // namespace diffuse::pipeline
