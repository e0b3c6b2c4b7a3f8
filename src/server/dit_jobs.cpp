#include "server/dit_jobs.h"

#include <torch/torch.h>

#include <algorithm>

#include "diffuse/image.h"
#include "pipeline/image_parameters.h"
#include "pipeline/stable_diffusion.h"  // to_images

namespace diffuse::server {

JobOutput run_dit_images(const JobRequest& request, JobContext& context, const PipelineInfo& info,
                         const std::string& model_path, LatentPreview& preview,
                         const DitImageRunner& run_one, std::optional<double> image_guidance) {
  const auto& c = request.config;
  const uint64_t base_seed = c.seed.value_or(0);
  const int images = request.images();
  const int total_steps = images * c.steps;
  JobOutput out;
  StageTimings sum;
  for (int i = 0; i < images; ++i) {
    // Prompt-major like the Stable Diffusion engine: batch b, prompt p, copy k.
    const int per_batch = static_cast<int>(c.prompts.size()) * c.images_per_prompt;
    const size_t prompt = static_cast<size_t>((i % per_batch) / c.images_per_prompt);
    const uint64_t seed = base_seed + static_cast<uint64_t>(i);
    auto r = run_one(prompt, seed, i * c.steps, total_steps);
    preview.learn(r.latents, r.image);
    pipeline::ImageParameters p;
    p.prompt = c.prompts[prompt];
    p.negative_prompt = negative_prompt_for(c, prompt);
    p.steps = c.steps;
    p.scheduler = info.scheduler;
    p.cfg_scale = c.guidance_scale;
    p.seed = seed;
    p.width = static_cast<int>(r.image.size(2));
    p.height = static_cast<int>(r.image.size(1));
    p.model = model_path;
    if (request.kind == JobKind::edit && image_guidance) p.image_guidance = *image_guidance;
    p.device = info.device;
    p.dtype = info.unet_dtype;
    out.images.push_back({encode_png(pipeline::to_images(r.image)[0], p.png_chunks()), p});
    add_timings(sum, r.timings);
    for (const auto& w : r.warnings)
      if (std::find(out.warnings.begin(), out.warnings.end(), w) == out.warnings.end())
        out.warnings.push_back(w);
    if (r.interrupted || context.interrupted()) break;  // A1111: the images so far
  }
  out.timings = timings_json(sum);
  return out;
}

}  // namespace diffuse::server
