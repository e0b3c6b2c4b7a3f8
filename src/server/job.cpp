#include "server/job.h"

namespace diffuse::server {

const char* to_string(JobKind kind) {
  switch (kind) {
    case JobKind::txt2img:
      return "txt2img";
    case JobKind::img2img:
      return "img2img";
    case JobKind::edit:
      return "edit";
  }
  return "unknown";
}

std::optional<JobKind> job_kind_from_string(const std::string& name) {
  for (auto k : {JobKind::txt2img, JobKind::img2img, JobKind::edit})
    if (name == to_string(k)) return k;
  return std::nullopt;
}

const char* to_string(JobState state) {
  switch (state) {
    case JobState::queued:
      return "queued";
    case JobState::running:
      return "running";
    case JobState::succeeded:
      return "succeeded";
    case JobState::failed:
      return "failed";
    case JobState::cancelled:
      return "cancelled";
  }
  return "unknown";
}

nlohmann::json JobRequest::describe() const {
  const auto& c = config;
  nlohmann::json j = {{"mode", to_string(kind)},
                      {"prompt", c.prompts},
                      {"negative_prompt", c.negative_prompts},
                      {"width", c.width},
                      {"height", c.height},
                      {"steps", c.steps},
                      {"guidance_scale", c.guidance_scale},
                      {"scheduler", c.scheduler},
                      {"prompt_syntax", c.prompt_syntax},
                      {"seed", c.seed.value_or(0)},
                      {"num_images", c.images_per_prompt},
                      {"batch_count", batch_count}};
  if (kind == JobKind::img2img) j["strength"] = c.strength;
  if (kind == JobKind::edit) {
    j["image_guidance_scale"] = edit.image_guidance_scale;
    j["clip_cfg_norm"] = edit.clip_cfg_norm;
    j["refine_strength"] = edit.refine_strength;
    j["auto_resize"] = edit.auto_resize;
  }
  if (c.eta != 0) j["eta"] = c.eta;
  return j;
}

}  // namespace diffuse::server
