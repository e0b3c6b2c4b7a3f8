// `diffuse bench`: runs the stages of a Stable Diffusion pipeline at real model sizes — text
// encoder, UNet steps, VAE decode — with random weights from a built-in architecture (or the
// weights of a real model), and reports per-stage time, peak memory, the UNet step's FLOPs and
// how close the step comes to this machine's matmul/conv roofline.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/flop_counter.h"
#include "bench/op_profile.h"
#include "bench/roofline.h"
#include "bench/whole_image_bench.h"
#include "diffuse/cpu_share.h"

namespace diffuse::bench {

struct PipelineBenchOptions {
  std::string arch = "sd2.1-base";  // built-in architecture (bench/arch_configs.h)
  std::string model;                // a diffusers folder or single file instead of `arch`
  // device, dtype, vae_dtype, attention and pack_conv_weights, as the pipeline takes them.
  LoadOptions load;
  int width = 0, height = 0;  // 0 = the model's default size
  int steps = 1;              // timed UNet steps, after the warm-up steps
  int warmup = 1;             // untimed UNet steps first (one-time costs; FLOPs are counted
                              // in the first step, timed or not)
  int batch = 2;              // UNet batch: 2 = one image with classifier-free guidance
  bool text_encoder = true;
  bool unet = true;
  bool vae = true;
  bool roofline = true;  // measure the roofline in the same run
  // Also time the UNet step in float32 with math attention (the engine's plain baseline) after
  // the main measurement, and report the speed-up.
  bool baseline = false;
  // Also run one more UNet step under an OpProfile and report its time by operator kind.
  bool profile = false;
  // Time the UNet step as a replayed device graph (after checking it against the eager call).
  bool graph = false;
  // Whole-image runs: the first is reported apart (one-time costs: kernels loading, cuDNN
  // plans), the median of the others is the image's time. 1 = that one run.
  int whole_image_runs = 1;
  // With a model folder: first a real text-to-image run of this many steps (DPM++ 2M, guidance
  // 7.5, the bench's size), put against `whole_image_steps` x the step limit + the decode limit.
  int whole_image_steps = 0;
  uint64_t seed = 0;
  std::function<void(const std::string&)> log;  // progress lines (null = quiet)
};

struct UNetRun {
  std::string dtype, attention;
  std::vector<double> step_s;  // timed steps
  double step_mean_s = 0;
  double step_min_s = 0;
  double step_median_s = 0;
  CpuShare cpu;                  // the timed steps' threads and what other processes took meanwhile
  bool graph = false;            // the timed steps replayed a device graph
  bool graph_identical = false;  // its output equalled the eager call's, bit for bit
  double graph_max_abs_diff = 0;
};

struct PipelineBenchResult {
  std::string arch, model, device, dtype, vae_dtype, text_encoder_dtype, attention;
  std::string attention_self, attention_cross;  // what `attention` runs for the UNet's
                                                // largest self- and cross-attention
  int width = 0, height = 0, batch = 0, threads = 0;
  double build_s = 0;
  double text_encoder_s = 0;  // one forward of `batch` prompts (77 tokens)
  UNetRun unet;
  double vae_decode_s = 0;          // one image
  FlopCounts vae_flops;             // that decode
  double vae_roofline_limit_s = 0;  // its FLOPs at the roofline's rates for the VAE's dtype
  // Memory in MiB (2^20 bytes); the JSON keys keep the "_mb" names.
  double peak_rss_mb = 0;  // process peak while models were built and run (before baseline)
  // Peak RSS during each stage (where the system lets the peak mark be reset; else 0):
  double build_peak_mb = 0, text_encoder_peak_mb = 0, unet_peak_mb = 0, vae_peak_mb = 0;
  // On an accelerator with allocator statistics (cuda, npu), what tensors held there at the
  // peak of each stage and overall; all 0 on the CPU.
  double device_peak_mb = 0;
  double build_device_peak_mb = 0, text_encoder_device_peak_mb = 0, unet_device_peak_mb = 0,
         vae_device_peak_mb = 0;
  double models_rss_mb = 0;      // RSS with the three networks built, before running them
  double packed_weights_mb = 0;  // the UNet's packed convolution weights after its steps
  double unet_params_m = 0, text_encoder_params_m = 0, vae_params_m = 0;
  FlopCounts unet_flops;                 // one step at `batch`
  std::optional<Roofline> roofline;      // in the UNet's dtype
  std::optional<Roofline> vae_roofline;  // only when the VAE runs in another dtype
  double roofline_limit_s = 0;           // conv / conv rate + (matmul + attention) / matmul rate
  double roofline_fraction = 0;          // roofline_limit_s / unet step mean
  std::optional<UNetRun> baseline;
  // With `profile`: one step's wall time, the time inside operators by kind and the longest
  // operators (bench/op_profile.h).
  double profile_step_s = 0;
  std::vector<OpTime> profile_kinds, profile_ops;
  // With `whole_image_steps`: that run, and its limit (steps x the step limit + the decode
  // limit; the text encoder is not counted), 0 without the roofline. The limit takes the
  // faster rates of a roofline measured just before that run (in the fresh process the
  // pipeline runs in) and of the stage benchmark's: after the run, the freed model leaves part
  // of the heap in 4 KiB pages (huge pages measured 2.3 of 2.9 GiB in the stage benchmark,
  // 2.6 of 2.8 in the pipeline) and the later roofline alone read up to 10 % lower, which
  // flattered the ratio. whole_image_roofline holds those rates.
  std::optional<WholeImageResult> whole_image;
  std::optional<Roofline> whole_image_roofline;
  std::optional<Roofline> whole_image_vae_roofline;  // only when the VAE runs in another dtype
  double whole_image_limit_s = 0;
};

PipelineBenchResult run_pipeline_bench(const PipelineBenchOptions& options);

// The time `flops` take at the roofline's rates: conv at its conv rate, matmul and attention at
// its matmul rate (0 when the roofline has no rates).
double roofline_limit_s(const FlopCounts& flops, const Roofline& roofline);

}  // namespace diffuse::bench
