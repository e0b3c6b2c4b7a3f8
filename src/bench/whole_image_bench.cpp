#include "bench/whole_image_bench.h"

#include "bench/bench_util.h"
#include "diffuse/errors.h"

namespace diffuse::bench {

WholeImageResult run_whole_image_bench(const WholeImageOptions& o) {
  if (o.model.empty())
    throw InvalidArgument("--whole-image needs a model (-m FOLDER): it runs the real pipeline");
  if (o.steps < 1)
    throw InvalidArgument("--whole-image must be >= 1 steps, got " + std::to_string(o.steps));
  WholeImageResult r;
  r.steps = o.steps;
  r.scheduler = o.scheduler;
  r.cache_before_load = page_cache_state(weight_files(o.model));
  // Two loads: the first as the page cache was (cold after dropping caches), the second warm.
  // Only the second pipeline is kept, so the process never holds two models.
  double t0 = now_s();
  std::optional<Text2Image> pipe = Text2Image::load(o.model, o.load);
  r.load_s = now_s() - t0;
  pipe.reset();
  t0 = now_s();
  pipe = Text2Image::load(o.model, o.load);
  r.warm_load_s = now_s() - t0;

  GenerationConfig cfg;
  cfg.prompts = {"a photograph of an astronaut riding a horse"};
  cfg.width = o.width;
  cfg.height = o.height;
  cfg.steps = o.steps;
  cfg.guidance_scale = o.guidance_scale;
  cfg.scheduler = o.scheduler;
  cfg.seed = o.seed;
  const GenerationResult g = pipe->generate(cfg);
  const StageTimings& t = g.timings;
  r.width = g.images.empty() ? 0 : g.images[0].width;
  r.height = g.images.empty() ? 0 : g.images[0].height;
  r.text_encode_s = t.text_encode_s;
  r.denoise_s = t.denoise_s;
  r.vae_decode_s = t.vae_decode_s;
  r.generate_s = t.total_s;
  r.step_s = t.step_s;
  r.cpu = t.cpu;
  r.peak_rss_mb = mb(peak_rss_bytes());
  return r;
}

}  // namespace diffuse::bench
