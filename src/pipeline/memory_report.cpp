#include "pipeline/memory_report.h"

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

}  // namespace diffuse::pipeline
