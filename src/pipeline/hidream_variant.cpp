#include "pipeline/hidream_variant.h"

#include "diffuse/errors.h"

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

}  // namespace

std::vector<std::string> hidream_variant_names() {
  return {"auto", "i1-full", "i1-dev", "i1-fast", "e1", "e1.1"};
}

HiDreamDefaults hidream_defaults(const io::ModelFolder& folder, const std::string& variant) {
  if (variant != "auto") return named(variant);
  if (folder.model_index().get<std::string>("_class_name", "") == "HiDreamImageEditingPipeline")
    return named("e1");
  const auto scheduler = folder.component_config("scheduler", "scheduler_config.json");
  if (scheduler.get<std::string>("_class_name", "").find("Flash") != std::string::npos)
    return named(scheduler.get<double>("shift", 3.0) >= 4.5 ? "i1-dev" : "i1-fast");
  return named("i1-full");
}

}  // namespace diffuse::pipeline
