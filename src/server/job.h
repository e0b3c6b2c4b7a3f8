// A generation job of the server: what was asked, and what a client can see of it while it
// waits, runs and after it ended.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "diffuse/image.h"
#include "diffuse/pipeline.h"
#include "pipeline/image_parameters.h"

namespace diffuse::server {

// edit: instruction-based editing of the init image (HiDream-E1).
enum class JobKind { txt2img, img2img, edit };
enum class JobState { queued, running, succeeded, failed, cancelled };
const char* to_string(JobKind kind);
std::optional<JobKind> job_kind_from_string(const std::string& name);
const char* to_string(JobState state);
inline bool is_finished(JobState s) {
  return s != JobState::queued && s != JobState::running;
}

// What only an edit job has (HiDream-E1's guidance).
struct EditOptions {
  double image_guidance_scale = 4.0;
  bool clip_cfg_norm = true;   // cap the text guidance's per-pixel norm (E1's default)
  double refine_strength = 0;  // the last steps on I1's weights (needs the E1 LoRA)
  // FLUX Kontext: the source scaled to the preferred Kontext resolution of the nearest aspect
  // ratio (the reference's default); false: kept at its own size, floored to the size multiple.
  bool auto_resize = true;
};

struct JobRequest {
  JobKind kind = JobKind::txt2img;
  GenerationConfig config;  // seed always set (a random one is drawn at submission)
  Image init_image;         // img2img and edit: the source image
  EditOptions edit;
  int batch_count = 1;  // runs one after another with seed, seed+1, ... (A1111's n_iter)
  bool preview = true;  // per-step preview images (latents projected to RGB, no VAE)
  std::string api;      // "native", "a1111", "openai": who asked, for the job list

  int images() const {
    return static_cast<int>(config.prompts.size()) * config.images_per_prompt * batch_count;
  }
  // The request as the native API describes it (also the A1111 "parameters").
  nlohmann::json describe() const;
};

struct JobImage {
  std::string png;  // with the "parameters" and "diffuse" text chunks
  pipeline::ImageParameters parameters;
};

// What the runner hands back.
struct JobOutput {
  std::vector<JobImage> images;
  nlohmann::json timings;  // per stage, seconds; memory
  std::vector<std::string> warnings;
};

struct JobProgress {
  int step = 0;   // steps done over the whole job (all batches)
  int total = 0;  // 0 until the first step reports it
  double elapsed_s = 0;
  double eta_s = -1;        // -1 = unknown
  std::string preview_png;  // the latest preview, empty if none
  int preview_step = 0;
};

// A consistent copy of a job at one moment. Images are shared, not copied, between snapshots.
struct JobSnapshot {
  std::string id;
  JobKind kind = JobKind::txt2img;
  JobState state = JobState::queued;
  int position = 0;  // 1 = next to run; 0 when not waiting
  JobProgress progress;
  std::shared_ptr<const JobOutput> output;  // when succeeded
  std::string error;                        // when failed or cancelled
  bool interrupted = false;  // asked to finish early (A1111's interrupt); its images are partial
  uint64_t seq = 0;          // grows with every change (events)
  uint64_t seed = 0;
  double created_at = 0, started_at = 0, finished_at = 0;  // unix seconds, 0 = not yet
  nlohmann::json request;                                  // JobRequest::describe()
  std::string api;
};

}  // namespace diffuse::server
