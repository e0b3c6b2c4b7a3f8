#include "server/sd_engine.h"

#include "diffuse/errors.h"
#include "pipeline/stable_diffusion.h"

#include <set>

namespace diffuse::server {

SdEngine::SdEngine(std::string model_path, const LoadOptions& options)
    : Engine(std::move(model_path)),
      t2i_(Text2Image::load(this->model_path(), options)),
      i2i_(Image2Image::sharing(t2i_)) {}

ModelDefaults SdEngine::defaults() const {
  ModelDefaults d;
  d.width = info().default_width;
  d.height = info().default_height;
  d.size_multiple = t2i_.impl()->vae_scale_factor();
  d.vae_factor = d.size_multiple;
  d.scheduler = "";  // the model's own, resolved by the pipeline
  d.schedulers = scheduler_names();
  return d;
}

void SdEngine::join_parallel(const parallel::ParallelGroups& groups) {
  if (!groups.cfg || groups.sequence)
    throw InvalidArgument(
        "a Stable Diffusion UNet shares its work over ranks with --parallel cfg only");
  t2i_.impl()->set_cfg_group(groups.cfg);  // i2i_ shares the pipeline
}

JobOutput SdEngine::run(const JobRequest& request, JobContext& context) {
  const GenerationConfig& base = request.config;
  const uint64_t seed = base.seed.value_or(0);
  JobOutput out;
  StageTimings sum;
  std::set<std::string> warnings;
  for (int b = 0; b < request.batch_count; ++b) {
    GenerationConfig g = base;
    g.seed = seed + static_cast<uint64_t>(b);
    auto on_step = [&](const StepEvent& e) {
      std::string preview;
      const torch::Tensor* shown = e.denoised ? e.denoised : e.latents;
      if (request.preview && shown) preview = encode_png(preview_.project(*shown));
      return context.step(b * e.num_steps + e.step + 1, request.batch_count * e.num_steps,
                          std::move(preview));
    };
    GenerationResult r = request.kind == JobKind::txt2img
                             ? t2i_.generate(g, on_step)
                             : i2i_.generate(g, request.init_image, on_step);
    preview_.learn(r.latents, r.images_float);
    for (size_t i = 0; i < r.images.size(); ++i) {
      const size_t prompt = i / static_cast<size_t>(g.images_per_prompt);
      pipeline::ImageParameters p;
      p.prompt = g.prompts[prompt];
      p.negative_prompt = negative_prompt_for(g, prompt);
      p.steps = g.steps;
      p.scheduler = g.scheduler.empty() ? info().scheduler : g.scheduler;
      p.cfg_scale = g.guidance_scale;
      p.seed = r.seed;
      p.width = r.images[i].width;
      p.height = r.images[i].height;
      p.model = model_path();
      if (request.kind == JobKind::img2img) p.strength = g.strength;
      p.device = info().device;
      p.dtype = info().unet_dtype;
      out.images.push_back({encode_png(r.images[i], p.png_chunks()), p});
    }
    add_timings(sum, r.timings);
    for (const auto& w : r.warnings)
      if (warnings.insert(w).second) out.warnings.push_back(w);
    if (r.interrupted || context.interrupted()) break;  // A1111: the images so far
  }
  out.timings = timings_json(sum);
  return out;
}

}  // namespace diffuse::server
