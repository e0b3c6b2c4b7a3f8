// The image loop of a DiT model's server job (HiDream, FLUX): one image per prompt, copy and
// batch in prompt-major order, each with its own seed (seed + i) so any one can be made again
// alone; PNGs with their parameters, summed timings, deduplicated warnings, the latent preview
// learning from every result, and A1111's "the images so far" on interruption.
#pragma once
#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "diffuse/pipeline.h"
#include "server/engine.h"
#include "server/job.h"
#include "server/job_queue.h"
#include "server/latent_preview.h"

namespace diffuse::server {

// What one image's run gives the loop.
struct DitImage {
  torch::Tensor image;    // [1, H, W, 3] float in [0, 1]
  torch::Tensor latents;  // [1, C, h, w], for the preview's fit
  StageTimings timings;
  std::vector<std::string> warnings;
  bool interrupted = false;
};

// Runs image i of the job: prompt `prompt` with `seed`, its steps counted from `first_step` of
// `total_steps`.
using DitImageRunner =
    std::function<DitImage(size_t prompt, uint64_t seed, int first_step, int total_steps)>;

// `image_guidance`: written into the images' parameters of edit jobs (HiDream-E1's).
JobOutput run_dit_images(const JobRequest& request, JobContext& context, const PipelineInfo& info,
                         const std::string& model_path, LatentPreview& preview,
                         const DitImageRunner& run_one,
                         std::optional<double> image_guidance = std::nullopt);

}  // namespace diffuse::server
