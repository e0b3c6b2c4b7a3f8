// Sub-commands of the `diffuse` CLI. Each registers its flags on a CLI11 sub-app and returns
// the exit code when run. The CLI is thin: parse flags, call the library, print.
#pragma once
#include <CLI/CLI.hpp>

#include "accel/dit_cache.h"
#include "bench/dit_cache_bench.h"
#include "bench/pipeline_bench.h"
#include "diffuse/pipeline.h"
#include "nn/layers.h"
#include "parallel_flags.h"
#include "pipeline/image_parameters.h"

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace diffuse::app {

using Command = std::function<int()>;

Command add_verify_command(CLI::App& app);
Command add_txt2img_command(CLI::App& app);
Command add_img2img_command(CLI::App& app);
Command add_create_demo_command(CLI::App& app);
Command add_doctor_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_train_demo_command(CLI::App& app);
Command add_edit_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_quantize_command(CLI::App& app);
Command add_export_command(CLI::App& app);

// The DiT families from the CLI: `diffuse edit` and `diffuse txt2img` on a HiDream or FLUX
// folder (the HiDream-only and FLUX-only flags are refused on the other family).
struct DitCliFlags {
  std::string model, transformer = "transformer";
  std::string prompt, negative_prompt;
  std::string image;  // edit: the source PNG
  int width = 1024, height = 1024;
  // Unset: the variant's defaults (pipeline/hidream_variant.h).
  std::string variant = "auto";
  std::optional<int> steps;
  std::optional<double> cfg_scale, image_guidance, refine;
  bool no_clip_cfg_norm = false;
  std::string e1_lora;  // edit: HiDream-E1-Full's peft LoRA on the I1 transformer
  std::optional<double> lora_alpha, lora_rank;
  std::optional<std::string> seed;
  // Replaying a run exactly (golden sets): initial latents, and noise.0.. for stochastic
  // schedulers; both safetensors files.
  std::string latents_file, step_noise_file;
  std::string out = "output.png";
  std::string device = "auto", dtype = "auto", attention = "auto";
  std::string text_encoder_device, vae_device;  // empty: --device
  std::string stream_weights = "auto";          // transformer weight streaming: auto|on|off
  std::string weights = "none";                 // the transformer's linear weights: none|q8_0|q4_0
  std::string max_memory;  // --max-memory: the memory plan's budget ("24G"); empty: what is free
  VaeTilingOptions vae_tiling;
  std::string cache = "off";    // --cache: a DiT cache spec (accel/dit_cache.h)
  std::string scheduler;        // a flow-matching scheduler by name; empty: the folder's
  std::vector<LoraSpec> loras;  // on the transformer
  bool lora_lenient = false;
  bool quiet = false;
  bool json = false;  // a JSON summary on stdout (files, seed, timings, memory, cpu, loras)
  // FLUX: a second pass on the negative prompt above 1; T5 tokens (default 512, schnell 256);
  // Kontext's resize of the source to its training resolutions (off: the source's size).
  std::optional<double> true_cfg_scale;
  int area_side = 0;  // HiDream text-to-image: the area's side (0: the model's)
  std::optional<int64_t> max_sequence_length;
  bool no_auto_resize = false;
  // FLUX img2img (txt2img with `image` set): how far from the image, in (0, 1].
  double strength = 0.8;
  // A mask (PNG, white = repaint): FLUX img2img and Kontext / HiDream-E1 edits stay inside it.
  std::string mask;
  double mask_blur = 0;
  bool invert_mask = false;
  int mask_crop = -1;      // FLUX img2img only
  ParallelFlags parallel;  // HiDream: --parallel ulysses over --devices or torchrun's ranks
};
// Text-to-image (edit = false) or editing; writes f.out. A FLUX folder goes to run_flux, a
// Qwen-Image folder to run_qwenimage.
int run_hidream(const DitCliFlags& f, bool edit);
// FLUX.1 text-to-image or FLUX.1 Kontext editing; writes f.out.
int run_flux(const DitCliFlags& f, bool edit);
// Qwen-Image text-to-image or Qwen-Image-Edit editing; writes f.out.
int run_qwenimage(const DitCliFlags& f, bool edit);
// What a DiT run reports once its PNG is written.
struct DitRunReport {
  pipeline::ImageParameters params;  // seed, size, scheduler, device, dtype
  double load_s = 0;
  std::vector<std::string> loras;
  StageTimings timings;
  DitCacheOptions cache;
  accel::DitCacheStats cache_stats;
  nn::QuantizedLayers quantized;
};
// The JSON summary on stdout (--json), else the summary lines on stderr (unless --quiet), then
// the output's path on stdout; returns the exit code.
int finish_dit_run(const DitCliFlags& f, const DitRunReport& report, bool edit);
// `bench --arch hidream-i1 | flux-dev | flux-schnell`: the DiT block benchmark with the bench
// command's options.
int run_dit_block_bench(const bench::PipelineBenchOptions& options, bool as_json);
// `bench --arch t5-xxl | llama-3.1-8b`: one forward of a full-size text encoder.
int run_text_encoder_bench(const bench::PipelineBenchOptions& options, bool as_json);
// `bench demo-quality`, registered on the bench sub-app: the sub-app and its runner.
std::pair<CLI::App*, Command> add_bench_demo_quality(CLI::App& bench);
// `bench accel`: DeepCache and token merging vs the full computation.
std::pair<CLI::App*, Command> add_bench_accel(CLI::App& bench);
// `bench accel -m <HiDream folder>`: the DiT caches against off (bench/dit_cache_bench.h).
int run_dit_cache_bench_command(const bench::DitCacheBenchOptions& options, bool as_json);
std::pair<CLI::App*, Command> add_bench_lora(CLI::App& bench);
std::pair<CLI::App*, Command> add_bench_hidream_stream(CLI::App& bench);
std::pair<CLI::App*, Command> add_bench_vae_tiling(CLI::App& bench);
// `bench gemm`: our bf16 product against oneDNN's on the models' shapes (bench/gemm_bench.h).
std::pair<CLI::App*, Command> add_bench_gemm(CLI::App& bench);
// `bench parallel`: Ulysses on 1, 2 and 4 CPU processes (cmd_bench_parallel.cpp).
std::pair<CLI::App*, Command> add_bench_parallel(CLI::App& bench);

}  // namespace diffuse::app
