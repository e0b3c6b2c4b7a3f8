// `diffuse bench lora`: what LoRA costs on a real-size model with random weights (SD2.1-base by
// default) and a random rank-16 adapter over every attention projection of the UNet and the text
// encoder: reading/checking it, applying, rescaling and removing it merged (weights patched from
// kept originals; the restore is checked bit for bit), and the UNet step plain vs merged vs
// unmerged (run-time low-rank products), all measured in one run.
#pragma once
#include <functional>
#include <string>

namespace diffuse::bench {

struct LoraBenchOptions {
  std::string arch = "sd2.1-base";
  int rank = 16;
  int width = 512, height = 512;
  int batch = 2;    // the UNet batch (2 = classifier-free guidance)
  int repeats = 2;  // timed UNet steps per setting, after one warm-up
  std::string dtype = "auto";
  uint64_t seed = 0;
  std::function<void(const std::string&)> log;
};

struct LoraBenchResult {
  std::string arch, dtype;
  int rank = 0, pairs = 0;
  double adapter_params_m = 0;
  double read_s = 0;                                // make_lora: map and check every pair
  double apply_s = 0, rescale_s = 0, remove_s = 0;  // merged, medians of 3
  double attach_s = 0, detach_s = 0;                // unmerged, medians of 3
  bool restored_bit_identical = false;
  double step_plain_s = 0, step_merged_s = 0, step_unmerged_s = 0;  // medians
};

LoraBenchResult run_lora_bench(const LoraBenchOptions& options);

}  // namespace diffuse::bench
