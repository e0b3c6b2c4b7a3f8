// `diffuse bench -m FOLDER --whole-image N`: one real text-to-image run through the public
// pipeline (load, text encoder, N denoising steps, VAE decode), timed stage by stage, with the
// model load measured cold or warm as the page cache says, so the whole image can be put
// against the roofline limits the stage benchmark measures in the same process.
#pragma once
#include <string>
#include <vector>

#include "bench/page_cache.h"
#include "diffuse/cpu_share.h"
#include "diffuse/pipeline.h"

namespace diffuse::bench {

struct WholeImageOptions {
  std::string model;          // a diffusers folder or single-file checkpoint
  LoadOptions load;           // device, dtypes, attention: the bench's
  int width = 0, height = 0;  // 0 = the model's default size
  int steps = 20;
  std::string scheduler = "dpmpp_2m";
  double guidance_scale = 7.5;  // > 1: the UNet runs at batch 2, as the stage bench's step
  uint64_t seed = 0;
  bool cuda_graph = false;  // GenerationConfig::cuda_graph
  // Generations in a row: with more than one, the first is reported apart (first_generate_s)
  // and the stage times are the median run's.
  int runs = 1;
};

struct WholeImageResult {
  int width = 0, height = 0, steps = 0;
  std::string scheduler;
  PageCacheState cache_before_load;  // the weight files in the page cache before the first load
  double load_s = 0;                 // first load (cold when cache_before_load is ~0 %)
  // The same load again, the files now cached, into the memory the first load freed: a lower
  // bound for a new process with a warm cache, which first-touches its memory (on the dev VM
  // that took 7-9 s against 3-3.6 s here; load_s of `txt2img --json` measures it).
  double warm_load_s = 0;
  double text_encode_s = 0, denoise_s = 0, vae_decode_s = 0;
  double generate_s = 0;        // text encode + denoise + decode, as the pipeline reports its total
  double first_generate_s = 0;  // the first run's, when there were several
  std::vector<double> generate_runs_s;  // every run's, in order
  std::vector<double> step_s;
  CpuShare cpu;            // the denoising loop's threads and what other processes took
  double peak_rss_mb = 0;  // process peak after the run
};

WholeImageResult run_whole_image_bench(const WholeImageOptions& options);

}  // namespace diffuse::bench
