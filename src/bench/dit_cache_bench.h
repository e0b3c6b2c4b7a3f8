// `diffuse bench accel -m <HiDream folder>`: the DiT caches (accel/dit_cache.h) against the full
// computation on the HiDream-architecture demo model (models/demo-edit), in one run: each
// setting runs the same held-out edits and captions with the same seeds as the full computation
// (bench/demo_edit_quality.h); scene scores, PSNR against the full computation's images, the
// denoising time as a ratio to the full computation's, and the share of blocks that ran.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "bench/demo_edit_quality.h"
#include "diffuse/pipeline.h"

namespace diffuse::bench {

struct DitCacheSetting {
  std::string name;  // the --cache spec
  DitCacheOptions cache;
};
// off, fbcache at three thresholds, TaylorSeer at intervals 2 and 3 (orders 1 and 2), the
// default block schedule.
std::vector<DitCacheSetting> default_dit_cache_settings();

struct DitCacheBenchOptions {
  std::string model = "models/demo-edit";
  int edits = 20, prompts = 20, seeds = 1;
  int steps = 0;  // 0: the folder's
  std::string device = "auto", dtype = "auto";
  std::vector<DitCacheSetting> settings = default_dit_cache_settings();  // the first: reference
  std::function<void(const std::string&)> log;
};

struct DitCacheBenchRow {
  std::string name;
  double denoise_s = 0, speedup = 0;  // reference denoise_s / this one
  double blocks_run = 0;              // share of the blocks full computation runs
  EditTally edits, txt2img;
  double psnr_mean = 0, psnr_min = 0;  // vs the reference's images (kIdenticalPsnr if equal)
};

struct DitCacheBenchResult {
  std::string model, device, dtype;
  int steps = 0, images = 0;
  std::vector<DitCacheBenchRow> rows;
};

DitCacheBenchResult run_dit_cache_bench(const DitCacheBenchOptions& options);

}  // namespace diffuse::bench
