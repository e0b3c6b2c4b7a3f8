#include "pipeline/hidream_variant.h"

#include <cmath>
#include <optional>

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
