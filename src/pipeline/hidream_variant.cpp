#include "pipeline/hidream_variant.h"

#include <cmath>
#include <optional>

#include "accel/dit_cache.h"
#include "diffuse/errors.h"
#include "io/json_config.h"

namespace diffuse::pipeline {
namespace {

HiDreamDefaults named(const std::string& v) {
  if (v == "i1-full") return {v, 50, 5.0, 0.0, 0.0};
  if (v == "i1-dev") return {v, 28, 0.0, 0.0, 0.0};
  if (v == "i1-fast") return {v, 16, 0.0, 0.0, 0.0};
  if (v == "e1") return {v, 28, 5.0, 4.0, 0.3};
  if (v == "e1.1") return {v, 28, 3.0, 1.5, 0.0};
  std::string list;
  for (const auto& n : hidream_variant_names()) list += (list.empty() ? "" : ", ") + n;
  throw InvalidArgument("HiDream variant '" + v + "': expected one of " + list);
}

constexpr const char* kFolderDefaults = "_diffuse_defaults";

// The folder's own defaults; ConfigError naming the key for a value no run can use.
std::optional<HiDreamDefaults> folder_defaults(const io::ModelFolder& folder) {
  const auto& index = folder.model_index();
  if (!index.has(kFolderDefaults)) return std::nullopt;
  const io::JsonConfig d(index.json().at(kFolderDefaults),
                         index.source() + " (" + kFolderDefaults + ")");
  HiDreamDefaults out{"model folder", 28, 5.0, 4.0, 0.0};
  out.steps = static_cast<int>(d.get<int64_t>("steps", out.steps));
  if (out.steps < 1 || out.steps > 10000) d.fail("steps", "must be in [1, 10000]");
  out.guidance_scale = d.get_number("guidance_scale", out.guidance_scale);
  out.image_guidance_scale = d.get_number("image_guidance_scale", out.image_guidance_scale);
  for (const auto& [key, v] : {std::pair<const char*, double>{"guidance_scale", out.guidance_scale},
                               {"image_guidance_scale", out.image_guidance_scale}})
    if (!std::isfinite(v) || v < 0 || v > 100) d.fail(key, "must be a number in [0, 100]");
  return out;
}

}  // namespace

int64_t hidream_max_sequence_length(const io::ModelFolder& folder) {
  const auto& index = folder.model_index();
  if (!index.has(kFolderDefaults)) return 128;
  const io::JsonConfig d(index.json().at(kFolderDefaults),
                         index.source() + " (" + kFolderDefaults + ")");
  const auto n = d.get<int64_t>("max_sequence_length", 128);
  if (n < 1 || n > 4096) d.fail("max_sequence_length", "must be in [1, 4096]");
  return n;
}

std::map<std::string, std::string> dit_cache_defaults(const io::ModelFolder& folder) {
  std::map<std::string, std::string> out;
  const auto& index = folder.model_index();
  if (!index.has(kFolderDefaults)) return out;
  const auto& d = index.json().at(kFolderDefaults);
  if (!d.is_object() || !d.contains("cache")) return out;
  const std::string where = index.source() + " (" + kFolderDefaults + ".cache)";
  if (!d["cache"].is_object()) throw ConfigError(where + ": expected an object of method -> spec");
  for (const auto& [method, spec] : d["cache"].items()) {
    if (!spec.is_string())
      throw ConfigError(where + ": '" + method + "' must be a cache spec string");
    const auto value = spec.get<std::string>();
    if (value.rfind(method + ":", 0) != 0)
      throw ConfigError(where + ": '" + method + "' must be a " + method + " spec (" + method +
                        ":...), got \"" + value + "\"");
    accel::parse_dit_cache(value, where + "." + method);  // refused at load, not at a run
    out[method] = value;
  }
  return out;
}

std::string dit_cache_spec(const io::ModelFolder& folder, const std::string& spec) {
  if (spec.find(':') != std::string::npos) return spec;
  const auto defaults = dit_cache_defaults(folder);
  const auto it = defaults.find(spec);
  return it == defaults.end() ? spec : it->second;
}

std::vector<std::string> hidream_variant_names() {
  return {"auto", "i1-full", "i1-dev", "i1-fast", "e1", "e1.1"};
}

bool is_hidream_editing_folder(const io::ModelFolder& folder) {
  return folder.model_index().get<std::string>("_class_name", "") == "HiDreamImageEditingPipeline";
}

HiDreamDefaults hidream_defaults(const io::ModelFolder& folder, const std::string& variant) {
  if (variant != "auto") return named(variant);
  if (auto own = folder_defaults(folder)) return *own;
  if (is_hidream_editing_folder(folder)) return named("e1");
  const auto scheduler = folder.component_config("scheduler", "scheduler_config.json");
  if (scheduler.get<std::string>("_class_name", "").find("Flash") != std::string::npos)
    return named(scheduler.get<double>("shift", 3.0) >= 4.5 ? "i1-dev" : "i1-fast");
  return named("i1-full");
}

}  // namespace diffuse::pipeline
