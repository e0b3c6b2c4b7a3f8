// `diffuse bench accel`: DeepCache and token merging against the full computation, in one run.
// Quality (the demo model): every setting generates the same held-out prompts and seeds as the
// full computation; each image is scored by the scene scorer and compared with the full
// computation's image of the same prompt and seed (PSNR, SSIM). Speed: the whole denoising
// loop's time, as a ratio to the full computation's measured in the same run; with `arch` the
// loop runs on a full-size UNet with random weights (no quality there).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "diffuse/pipeline.h"
#include "train/scene_scorer.h"

namespace diffuse::bench {

struct AccelSetting {
  std::string name;  // "off", "deepcache 3", "tome 0.5", "deepcache 3 + tome 0.5"
  DeepCacheOptions deep_cache;
  TokenMergingOptions token_merging;
};
// off, DeepCache N = 2, 3, 5, ToMe 0.3 and 0.5, DeepCache 3 + ToMe 0.5.
std::vector<AccelSetting> default_accel_settings();

struct AccelBenchOptions {
  std::string model = "models/demo";  // quality mode: a demo-world model
  std::string arch;                   // speed mode instead: a built-in architecture
  int prompts = 20;                   // held-out prompts (quality mode)
  int seeds = 2;                      // seeds 0..seeds-1 per prompt
  int steps = 20;
  std::string scheduler = "dpmpp_2m";
  double guidance_scale = 7.5;
  int width = 0, height = 0;  // 0 = the model's size (speed mode: 512x512 for sd2.1-base)
  int repeats = 1;            // speed mode: denoising loops per setting (the fastest counts)
  std::string device = "auto", dtype = "auto", attention = "auto";
  std::vector<AccelSetting> settings = default_accel_settings();  // the first is the reference
  std::function<void(const std::string&)> log;
};

struct AccelBenchRow {
  std::string name;
  double denoise_s = 0;  // summed over the images (quality) or the fastest loop (speed)
  double speedup = 0;    // reference denoise_s / this one
  int full_steps = 0;    // UNet calls that ran the whole network, per generation
  train::QualityTally tally;
  double psnr_mean = 0, psnr_min = 0, ssim_mean = 0;  // vs the reference image; identical =
                                                      // kIdenticalPsnr
  int images = 0;
  // Speed mode, settings with token merging: what the pipeline's auto policy measures at this
  // size (accel/token_merging_payoff.h), to set beside the whole loop's speed-up: the merged
  // sites' self-attentions' speed-up, the whole UNet call's it predicts from them (against the
  // plain setting's call time in this run), and whether a run of these steps would keep
  // merging (a run that has measured this size before: no thrown-away first call).
  double tome_site_speedup = 0;
  double tome_call_speedup = 0;
  bool tome_kept = false;
};

struct AccelBenchResult {
  std::string mode;  // "quality" or "speed"
  std::string model, device, dtype;
  int width = 0, height = 0, steps = 0;
  std::vector<AccelBenchRow> rows;
};

constexpr double kIdenticalPsnr = 100.0;

AccelBenchResult run_accel_bench(const AccelBenchOptions& options);

// Image comparisons on [N, H, W, 3] float images in [0, 1] (as GenerationResult::images_float).
double psnr(const torch::Tensor& a, const torch::Tensor& b);
// Mean SSIM over the channels: 11x11 Gaussian window (sigma 1.5), the usual constants.
double ssim(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace diffuse::bench
