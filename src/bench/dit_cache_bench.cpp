#include "bench/dit_cache_bench.h"

#include <torch/torch.h>

#include <algorithm>

#include "accel/dit_cache.h"
#include "bench/accel_bench.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"

namespace diffuse::bench {

std::vector<DitCacheSetting> default_dit_cache_settings() {
  std::vector<DitCacheSetting> out;
  for (const char* spec : {"off", "fbcache:0.05", "fbcache:0.1", "fbcache:0.2", "taylorseer:2:1",
                           "taylorseer:3:1", "taylorseer:3:2", "ditcache"})
    out.push_back({spec, accel::parse_dit_cache(spec)});
  return out;
}

DitCacheBenchResult run_dit_cache_bench(const DitCacheBenchOptions& o) {
  if (o.settings.empty()) throw InvalidArgument("bench accel: no cache settings to compare");
  const auto folder = io::ModelFolder::open(o.model);
  const auto defaults = pipeline::hidream_defaults(folder);
  const auto device = device::resolve_device(o.device);
  const auto dtype = device::resolve_dtype(o.dtype, device, "transformer");
  pipeline::HiDreamPipeline pipe(folder, device, dtype);
  DitCacheBenchResult r;
  r.model = o.model;
  r.device = device::device_name(device);
  r.dtype = device::dtype_name(dtype);
  std::vector<torch::Tensor> reference;
  for (const auto& setting : o.settings) {
    DemoEditQualityOptions q;
    q.model = o.model;
    q.edits = o.edits;
    q.prompts = o.prompts;
    q.seeds = o.seeds;
    q.steps = o.steps;
    q.cache = setting.cache;
    q.keep_images = true;
    const auto run = run_demo_edit_quality(pipe, defaults, q);
    r.steps = run.steps;
    r.images = static_cast<int>(run.images.size());
    DitCacheBenchRow row;
    row.name = setting.name;
    row.denoise_s = run.denoise_s;
    row.blocks_run = run.cache.blocks_possible > 0
                         ? static_cast<double>(run.cache.blocks_run) /
                               static_cast<double>(run.cache.blocks_possible)
                         : 1.0;
    row.edits = run.edits;
    row.txt2img = run.txt2img;
    if (reference.empty()) reference = run.images;
    row.psnr_min = kIdenticalPsnr;
    double sum = 0;
    for (size_t i = 0; i < run.images.size() && i < reference.size(); ++i) {
      const double p = std::min(kIdenticalPsnr, psnr(run.images[i], reference[i]));
      sum += p;
      row.psnr_min = std::min(row.psnr_min, p);
    }
    row.psnr_mean =
        run.images.empty() ? kIdenticalPsnr : sum / static_cast<double>(run.images.size());
    row.speedup = r.rows.empty() ? 1.0 : r.rows.front().denoise_s / std::max(row.denoise_s, 1e-9);
    if (o.log)
      o.log(row.name + ": denoise " + std::to_string(row.denoise_s) + " s, x" +
            std::to_string(row.speedup) + ", edits fully right " +
            std::to_string(row.edits.fully_right) + "/" + std::to_string(row.edits.scores.images));
    r.rows.push_back(row);
  }
  return r;
}

}  // namespace diffuse::bench
