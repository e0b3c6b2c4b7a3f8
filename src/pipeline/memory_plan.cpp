#include "pipeline/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include "diffuse/errors.h"

namespace diffuse::pipeline {
namespace {

// One candidate: the choices a plan is made of.
struct Choice {
  enum Denoiser { kResident, kQuantized, kStreamed } denoiser = kResident;
  bool free_denoiser_for_text = false;
  bool keep_text = false;
  bool text_one_at_a_time = false;
  bool vae_tiled = false;
};

int64_t sum_text(const PlanRequest& r) {
  int64_t s = 0;
  for (const auto& t : r.text_encoders) s += t.bytes;
  return s;
}

const NetworkWeights* largest_text(const PlanRequest& r) {
  const NetworkWeights* best = nullptr;
  for (const auto& t : r.text_encoders)
    if (!best || t.bytes > best->bytes) best = &t;
  return best;
}

int64_t denoiser_resident(const PlanRequest& r, Choice::Denoiser d) {
  const auto& n = r.denoiser;
  switch (d) {
    case Choice::kQuantized:
      return n.quantized_bytes;
    case Choice::kStreamed:
      // The block in use and the one read ahead, plus what never streams.
      return n.outside_units + 2 * n.largest_unit;
    default:
      return n.bytes;
  }
}

std::vector<StagePeak> stage_peaks(const PlanRequest& r, const Choice& c) {
  const int64_t denoiser = denoiser_resident(r, c.denoiser);
  const int64_t all_text = sum_text(r);
  const auto* big = largest_text(r);
  const int64_t text_now = c.text_one_at_a_time ? (big ? big->bytes : 0) : all_text;
  const int64_t kept_text = c.keep_text ? all_text : 0;
  std::vector<StagePeak> p;
  if (r.residency == PlanRequest::Residency::kPerStage) {  // one network at a time
    if (!r.text_encoders.empty()) p.push_back({"text encode", all_text + r.text_activations});
    p.push_back({"denoise", denoiser + r.step_activations});
    p.push_back(
        {"VAE decode", r.vae.bytes + (c.vae_tiled ? r.vae_tiled_activations : r.vae_activations)});
    return p;
  }
  if (!r.text_encoders.empty())
    p.push_back({"text encode", text_now + r.text_activations + r.vae.bytes +
                                    (c.free_denoiser_for_text ? 0 : denoiser)});
  p.push_back({"denoise", denoiser + r.step_activations + r.vae.bytes + kept_text});
  p.push_back({"VAE decode", denoiser + r.vae.bytes + kept_text +
                                 (c.vae_tiled ? r.vae_tiled_activations : r.vae_activations)});
  return p;
}

int64_t sum_held(const PlanRequest& r) {
  int64_t s = 0;
  for (const auto& n : r.held) s += n.bytes;
  return s;
}

std::vector<StagePeak> peaks_of(const PlanRequest& r, const Choice& c) {
  auto p = stage_peaks(r, c);
  for (auto& stage : p) stage.bytes += sum_held(r);
  return p;
}

int64_t max_peak(const std::vector<StagePeak>& p) {
  int64_t m = 0;
  for (const auto& s : p) m = std::max(m, s.bytes);
  return m;
}

// The candidates the user's flags allow, cheapest in time first.
std::vector<Choice> candidates(const PlanRequest& r) {
  std::vector<Choice::Denoiser> denoisers;
  if (!r.weight_type.empty()) {
    denoisers = {Choice::kQuantized};  // quantized blocks do not stream
  } else {
    if (r.streaming != "on") denoisers.push_back(Choice::kResident);
    if (r.streaming != "off" && r.denoiser.largest_unit > 0) denoisers.push_back(Choice::kStreamed);
    // Streaming asked of a network without blocks to stream: planned resident (the loader
    // refuses the streaming itself, naming why).
    if (denoisers.empty()) denoisers.push_back(Choice::kResident);
  }
  std::vector<bool> tiles;
  if (r.vae_tiling != "on") tiles.push_back(false);
  if (r.vae_tiling != "off" && r.vae_tiled_activations > 0) tiles.push_back(true);
  if (tiles.empty()) tiles.push_back(false);
  const bool planned = r.residency == PlanRequest::Residency::kPlanned;
  const bool several = planned && r.text_encoders.size() > 1 && r.text_one_at_a_time_possible;
  std::vector<bool> keeps{false};
  if (r.residency == PlanRequest::Residency::kAllResident)
    keeps = {true};
  else if (planned && r.keep_text_encoders)
    keeps = {true, false};
  std::vector<Choice> out;
  for (auto d : denoisers)
    for (bool free_d : planned ? std::vector<bool>{false, true} : std::vector<bool>{false})
      for (bool keep : keeps)
        for (bool one : several ? std::vector<bool>{false, true} : std::vector<bool>{false})
          for (bool tiled : tiles) {
            if (free_d && r.text_encoders.empty()) continue;
            Choice c;
            c.denoiser = d;
            c.free_denoiser_for_text = free_d;
            c.keep_text = keep;
            c.text_one_at_a_time = one;
            c.vae_tiled = tiled;
            out.push_back(c);
          }
  return out;
}

std::string denoiser_text(const PlanRequest& r, const Choice& c) {
  const auto& n = r.denoiser;
  const std::string name = n.label.empty() ? n.component : n.label;
  switch (c.denoiser) {
    case Choice::kQuantized:
      return name + " " + r.weight_type + " resident " + format_memory(n.quantized_bytes);
    case Choice::kStreamed:
      return name + " " + r.denoiser_dtype + " streamed block by block (" +
             format_memory(denoiser_resident(r, c.denoiser)) + " resident of " +
             format_memory(n.bytes) + ")";
    default:
      return name + " " + r.denoiser_dtype + " resident " + format_memory(n.bytes);
  }
}

std::string line_of(const PlanRequest& r, const Choice& c, const std::vector<StagePeak>& peaks,
                    int64_t budget) {
  std::string s = "plan: ";
  if (!r.text_encoders.empty()) {
    const auto* big = largest_text(r);
    if (r.text_encoders.size() == 1)
      s += "text encoder " + format_memory(big->bytes);
    else if (c.text_one_at_a_time)
      s += "text encoders one at a time (largest " + big->label + " " + format_memory(big->bytes) +
           ")";
    else
      s += "text encoders together " + format_memory(sum_text(r));
    s += c.keep_text ? ", kept" : ", freed after encoding";
    s += "; ";
  }
  s += denoiser_text(r, c);
  if (c.free_denoiser_for_text) s += ", freed before the next prompt's encoders";
  if (r.residency == PlanRequest::Residency::kPerStage) s += ", freed after denoising";
  if (!r.held.empty())
    s += "; " +
         (r.held.size() == 1 ? r.held.front().label
                             : std::to_string(r.held.size()) + " " + r.held.front().label + "s") +
         " " + format_memory(sum_held(r)) + " held throughout";
  s += c.vae_tiled ? "; VAE tiled" : "; VAE whole";
  s += "; peak ~" + format_memory(max_peak(peaks));
  if (budget > 0)
    s += " of " + format_memory(budget) + (r.budget_given ? " (--max-memory)" : " available");
  s += " on " + r.device;
  return s;
}

MemoryPlan make_plan(const PlanRequest& r, const Choice& c, bool fits) {
  MemoryPlan p;
  p.fits = fits;
  p.text_one_at_a_time = c.text_one_at_a_time;
  p.keep_text_encoders = c.keep_text;
  p.stream_denoiser = c.denoiser == Choice::kStreamed;
  p.quantized_denoiser = c.denoiser == Choice::kQuantized;
  p.free_denoiser_for_text = c.free_denoiser_for_text;
  p.vae_tiled = c.vae_tiled;
  p.peaks = peaks_of(r, c);
  p.peak = max_peak(p.peaks);
  p.denoiser_parameters = r.denoiser.parameters;
  p.budget = r.budget;
  p.line = line_of(r, c, p.peaks, r.budget);
  return p;
}

// The candidate with the smallest peak (for the advice when none fits).
Choice smallest(const PlanRequest& r, const std::vector<Choice>& all) {
  Choice best = all.front();
  int64_t best_peak = std::numeric_limits<int64_t>::max();
  for (const auto& c : all) {
    const int64_t p = max_peak(peaks_of(r, c));
    if (p < best_peak) best_peak = p, best = c;
  }
  return best;
}

// Whether some plan fits `r`, and its peak.
bool any_fits(const PlanRequest& r, int64_t* peak) {
  for (const auto& c : candidates(r)) {
    const int64_t p = max_peak(peaks_of(r, c));
    if (p <= r.budget) {
      *peak = p;
      return true;
    }
  }
  return false;
}

std::string advice_for(const PlanRequest& r, const MemoryPlan& closest) {
  const StagePeak* worst = &closest.peaks.front();
  for (const auto& s : closest.peaks)
    if (s.bytes > worst->bytes) worst = &s;
  std::string s = "this run needs about " + format_memory(closest.peak) +
                  (r.size.empty() ? "" : " for " + r.size) + " (the " + worst->stage +
                  ", with every saving the flags allow: " + closest.line.substr(6) + ") but " +
                  format_memory(r.budget) +
                  (r.budget_given ? " is the --max-memory budget" : " is available") + " on " +
                  r.device;
  std::vector<std::string> would;
  int64_t peak = 0;
  if (r.weight_type.empty() && r.denoiser.quantized_bytes > 0) {
    for (const char* t : {"q8_0", "int8", "q4_0"}) {
      PlanRequest q = r;
      q.weight_type = t;
      // q4_0 holds about half of q8_0's bytes; the request carries q8_0/int8's size.
      if (std::string(t) == "q4_0")
        q.denoiser.quantized_bytes = r.denoiser.quantized_bytes * 9 / 17;
      if (any_fits(q, &peak)) {
        would.push_back(std::string("--weights ") + t + " (peak ~" + format_memory(peak) + ")");
        break;
      }
    }
  }
  if (r.streaming == "off" && r.denoiser.largest_unit > 0) {
    PlanRequest q = r;
    q.streaming = "auto";
    if (any_fits(q, &peak))
      would.push_back("--stream-weights auto (peak ~" + format_memory(peak) + ")");
  }
  if (r.vae_tiling == "off" && r.vae_tiled_activations > 0) {
    PlanRequest q = r;
    q.vae_tiling = "auto";
    if (any_fits(q, &peak)) would.push_back("VAE tiling (peak ~" + format_memory(peak) + ")");
  }
  if (worst->stage != "text encode" && r.step_activations > 0) {
    // Activations scale with the pixels; the smallest plan's weights stay.
    PlanRequest q = r;
    for (double f : {0.5, 0.25}) {
      q.step_activations = static_cast<int64_t>(r.step_activations * f);
      q.vae_activations = static_cast<int64_t>(r.vae_activations * f);
      q.vae_tiled_activations = static_cast<int64_t>(r.vae_tiled_activations * f);
      if (any_fits(q, &peak)) {
        would.push_back(std::string(f == 0.5 ? "half" : "a quarter") + " of the pixels of " +
                        r.size + " (peak ~" + format_memory(peak) + ")");
        break;
      }
    }
  }
  if (would.empty())
    s += "; nothing the flags offer fits: a device with more memory, or a smaller model";
  else {
    s += "; would fit: ";
    for (size_t i = 0; i < would.size(); ++i) s += (i ? ", or " : "") + would[i];
  }
  return s;
}

}  // namespace

std::string format_memory(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1024.0 * 1024 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.0f MiB", b / (1024.0 * 1024));
  return buf;
}

int64_t parse_memory_size(const std::string& text, const std::string& flag) {
  const auto bad = [&] {
    return InvalidArgument(flag + " '" + text +
                           "': expected a size such as 24G, 24GiB, 16000M or 1.5T (bytes when no "
                           "unit is given)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) throw bad();
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(text.substr(0, i), &used);
    if (used != i) throw bad();
  } catch (const std::logic_error&) {
    throw bad();
  }
  std::string unit = text.substr(i);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (unit.size() == 2 && unit[1] == 'I') unit.pop_back();  // GiB, MiB: powers of 1024 anyway
  double scale = 1;
  if (unit == "K")
    scale = 1024.0;
  else if (unit == "M")
    scale = 1024.0 * 1024;
  else if (unit == "G")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty())
    throw bad();
  const double bytes = value * scale;
  if (!(bytes >= 1) || bytes > 1e18) throw bad();
  return static_cast<int64_t>(std::llround(bytes));
}

MemoryPlan plan_memory(const PlanRequest& r) {
  const auto all = candidates(r);
  if (r.budget <= 0) {
    // Nothing known to plan against: the first candidate (resident, together, whole), as asked.
    auto p = make_plan(r, all.front(), true);
    p.line += " (free memory unknown: not checked)";
    return p;
  }
  for (const auto& c : all) {
    if (max_peak(peaks_of(r, c)) <= r.budget) return make_plan(r, c, true);
  }
  auto p = make_plan(r, smallest(r, all), false);
  p.advice = advice_for(r, p);
  return p;
}

}  // namespace diffuse::pipeline
