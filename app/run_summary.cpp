#include "run_summary.h"

#include <iostream>

#include "device/cpu_load.h"
#include "pipeline/cpu_report.h"
#include "pipeline/memory_report.h"
#include "progress.h"

namespace diffuse::app {
namespace {

struct Totals {
  double text = 0, encode = 0, denoise = 0, steps = 0, decode = 0, total = 0;
};

Totals totals(const std::vector<StageTimings>& runs) {
  Totals t;
  for (const auto& r : runs) {
    t.text += r.text_encode_s;
    t.encode += r.vae_encode_s;
    t.denoise += r.denoise_s;
    t.steps += static_cast<double>(r.step_s.size());
    t.decode += r.vae_decode_s;
    t.total += r.total_s;
  }
  return t;
}

std::string memory_text(const std::vector<StageMemory>& memory) {
  std::string s;
  for (const auto& m : memory) {
    if (!s.empty()) s += "; ";
    s += m.stage + " on " + m.device + ": ";
    if (m.allocated_bytes >= 0)
      s += format_bytes(m.allocated_bytes) + " allocated (peak " +
           format_bytes(m.peak_allocated_bytes) + ", reserved " + format_bytes(m.reserved_bytes) +
           "), ";
    s += "rss " + format_bytes(m.rss_bytes);
  }
  return s;
}

}  // namespace

nlohmann::json RunSummary::json() const {
  const Totals t = totals(runs);
  const StageTimings last = runs.empty() ? StageTimings() : runs.back();
  return {{"files", files},
          {"seed", seed},
          {"device", device},
          {"dtype", dtype},
          {"vae_dtype", vae_dtype},
          {"attention", attention},
          {"scheduler", scheduler},
          {"load_s", load_s},
          {"weight_bytes", weight_bytes},
          {"text_encode_s", t.text},
          {"vae_encode_s", t.encode},
          {"denoise_s", t.denoise},
          {"step_s", t.steps > 0 ? t.denoise / t.steps : 0.0},
          {"vae_decode_s", t.decode},
          {"total_s", t.total},
          {"peak_rss_mb", static_cast<double>(last.peak_rss_bytes) / (1024.0 * 1024.0)},
          {"memory", pipeline::memory_json(last.memory)},
          {"cpu", device::cpu_share_json(last.cpu)},
          {"plan", last.plan},
          {"loras", loras}};
}

void RunSummary::print(bool vae_encode) const {
  const Totals t = totals(runs);
  const StageTimings last = runs.empty() ? StageTimings() : runs.back();
  std::cerr << "timings: load " << format_seconds(load_s) << ", text encode "
            << format_seconds(t.text);
  if (vae_encode) std::cerr << ", vae encode " << format_seconds(t.encode);
  std::cerr << ", denoise " << format_seconds(t.denoise) << " ("
            << format_seconds(t.steps > 0 ? t.denoise / t.steps : 0) << "/step), vae decode "
            << format_seconds(t.decode) << ", total " << format_seconds(t.total) << "; peak memory "
            << format_bytes(last.peak_rss_bytes) << " (seed " << seed << ")\n";
  std::cerr << "memory: " << memory_text(last.memory) << "\n";
  if (!last.plan.empty()) std::cerr << last.plan << "\n";
  for (const auto& r : runs)
    if (auto note = pipeline::cpu_share_note(r.cpu); !note.empty()) {
      std::cerr << note << "\n";
      break;
    }
}

}  // namespace diffuse::app
