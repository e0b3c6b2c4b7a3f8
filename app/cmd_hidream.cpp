// `diffuse edit` (HiDream-E1: edit an image from an instruction) and `diffuse txt2img` on a
// HiDream-I1 folder: flags -> pipeline::HiDreamPipeline -> one PNG.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>

#include "accel/dit_cache.h"
#include "adapters/lora.h"
#include "commands.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "dit_cli.h"
#include "flag_checks.h"
#include "io/atomic_file.h"
#include "io/model_folder.h"
#include "load_flags.h"
#include "memory_flags.h"
#include "nn/attention.h"
#include "pipeline/cpu_report.h"
#include "pipeline/flux.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"
#include "pipeline/image_parameters.h"
#include "pipeline/qwenimage.h"
#include "pipeline/stable_diffusion.h"
#include "progress.h"
#include "quant/quantized_weight.h"
#include "run_summary.h"
#include "schedulers/scheduler.h"
#include "tensor_files.h"
#include "vae_tiling_flags.h"

namespace fs = std::filesystem;

namespace diffuse::app {
namespace {

Image to_image(const torch::Tensor& nhwc) {
  return pipeline::to_images(nhwc.index({torch::indexing::Slice(0, 1)}))[0];
}

}  // namespace

void check_flow_scheduler_name(const std::string& name) {
  const auto flow = schedulers::flow_scheduler_names();
  if (std::find(flow.begin(), flow.end(), name) != flow.end()) return;
  std::string list;
  for (const auto& n : flow) list += (list.empty() ? "" : ", ") + n;
  const auto ddpm = scheduler_names();
  const bool is_ddpm = std::find(ddpm.begin(), ddpm.end(), name) != ddpm.end();
  throw InvalidArgument(
      "--scheduler " + name + ": " +
      (is_ddpm ? "a scheduler for noise-predicting (Stable Diffusion) models; " : "unknown; ") +
      "the DiT models (HiDream, FLUX) run the flow-matching schedulers: " + list);
}

std::string dit_parallel_job(const DitCliFlags& f, bool edit, uint64_t seed, int steps,
                             double guidance) {
  return parallel_job_lines(f.parallel, f.model, seed,
                            {{"command", edit ? "edit" : "txt2img"},
                             {"transformer", f.transformer},
                             {"prompt", f.prompt},
                             {"negative prompt", f.negative_prompt},
                             {"image", f.image},
                             {"size", std::to_string(f.width) + "x" + std::to_string(f.height)},
                             {"steps", std::to_string(steps)},
                             {"guidance", c10::str(guidance)},
                             {"weights", f.weights},
                             {"cache", f.cache}});
}

// HiDream's parallel modes against the run: cfg needs guidance (its two branches, E1's three)
// and at most a rank per branch; cfg,ulysses an even number of ranks. InvalidArgument saying
// what would run.
void check_hidream_parallel_run(ParallelMode mode, int world, bool edit, double cfg_scale) {
  if (mode == ParallelMode::kUlysses) return;
  const std::string flag = mode == ParallelMode::kCfg ? "--parallel cfg" : "--parallel cfg,ulysses";
  if (cfg_scale <= 1.0)
    throw InvalidArgument(flag +
                          " splits the guidance branches, and guidance is off (--cfg-scale " +
                          c10::str(cfg_scale) + "); --parallel ulysses splits the tokens instead");
  const int branches = edit ? 3 : 2;
  if (mode == ParallelMode::kCfg && world > branches)
    throw InvalidArgument(flag + ": " + std::to_string(world) + " ranks for HiDream's " +
                          std::to_string(branches) +
                          " guidance branches (at most one rank per branch; cfg,ulysses splits "
                          "each branch share's tokens over more)");
  if (mode == ParallelMode::kCfgUlysses && world % 2 != 0)
    throw InvalidArgument(flag +
                          " runs on 2 x N ranks (two branch shares of N token shares), not " +
                          std::to_string(world));
}

std::string dit_cache_flag(const DitCliFlags& f) {
  if (f.cache.find(':') != std::string::npos) return f.cache;
  try {
    return pipeline::dit_cache_spec(io::ModelFolder::open(f.model), f.cache);
  } catch (const IoError&) {
    return f.cache;
  }
}

InpaintOptions dit_mask_options(const DitCliFlags& f) {
  InpaintOptions o;
  if (f.mask.empty()) {
    if (f.mask_blur > 0 || f.invert_mask || f.mask_crop >= 0)
      throw InvalidArgument("--mask-blur/--invert-mask/--mask-crop adjust a --mask: give one");
    return o;
  }
  o.mask = pipeline::image_to_tensor(read_png(f.mask));
  o.blur = f.mask_blur;
  o.invert = f.invert_mask;
  o.crop_padding = f.mask_crop;
  return o;
}

int run_hidream(const DitCliFlags& f, bool edit) {
  if (pipeline::is_flux_folder(f.model)) return run_flux(f, edit);
  if (pipeline::is_qwenimage_folder(f.model)) return run_qwenimage(f, edit);
  if (!f.mask.empty() && !edit)
    throw InvalidArgument("--mask: HiDream repaints a masked region in its edits (diffuse edit)");
  const auto mask_options = dit_mask_options(f);  // read before anything loads
  if (f.true_cfg_scale || f.max_sequence_length || f.no_auto_resize)
    throw InvalidArgument(
        "--true-cfg-scale/--max-sequence-length/--no-auto-resize: FLUX options; HiDream guides "
        "with --cfg-scale, takes 128 tokens per encoder and scales the source to its area");
  io::check_output_path(f.out, "output");
  if (fs::path(f.out).extension() != ".png")
    throw InvalidArgument("-o/--out '" + f.out +
                          "': only PNG output is supported (use a .png name)");
  if (f.refine && !(*f.refine >= 0.0 && *f.refine <= 1.0))
    throw InvalidArgument("--refine must be in [0, 1], got " + std::to_string(*f.refine));
  // The server's ranges (server/requests.cpp), so a run here is refused where a request is.
  for (const auto& [flag, value] :
       {std::pair<const char*, std::optional<double>>{"--cfg-scale", f.cfg_scale},
        {"--image-guidance", f.image_guidance}})
    if (value && !(*value >= 0.0 && *value <= 100.0))
      throw InvalidArgument(std::string(flag) + " must be in [0, 100], got " + c10::str(*value));
  if (f.lora_rank && !(*f.lora_rank >= 1.0 && *f.lora_rank == std::floor(*f.lora_rank)))
    throw InvalidArgument("--lora-rank must be a whole number >= 1, got " + c10::str(*f.lora_rank));
  if (f.lora_alpha && !std::isfinite(*f.lora_alpha))
    throw InvalidArgument("--lora-alpha must be a finite number");
  const auto cache = accel::parse_dit_cache(dit_cache_flag(f));
  quant::parse_weight_type(f.weights, "--weights");  // refused before the load
  require_shared_seed(f.parallel, f.seed.has_value());
  Image source;
  if (edit) {
    if (f.image.empty()) throw InvalidArgument("edit needs a source image (-i/--image)");
    source = read_png(f.image);
  }
  const auto device =
      device::resolve_device(f.parallel.is_worker() ? f.parallel.rank_device : f.device);
  const auto dtype = device::resolve_dtype(f.dtype, device, "transformer");
  const auto placement = pipeline::hidream_placement(f.text_encoder_device, f.vae_device, f.dtype);
  nn::set_default_attention_backend(nn::attention_backend_from_flag_or_env(f.attention, device));
  const uint64_t seed = f.seed ? parse_seed(*f.seed, "--seed") : std::random_device{}();

  const bool talk = !f.quiet && !f.json;  // --json keeps stdout for the summary alone
  if (!f.scheduler.empty()) check_flow_scheduler_name(f.scheduler);
  if (talk) std::cerr << "loading " << f.model << " ...\n";
  const auto t0 = std::chrono::steady_clock::now();
  auto folder = io::ModelFolder::open(f.model);
  // The folder's own "transformer" of an I1 folder is I1's: it does not edit.
  if (edit && f.e1_lora.empty() && f.transformer == "transformer" &&
      !pipeline::is_hidream_editing_folder(folder))
    throw InvalidArgument(
        f.model + " is a HiDream-I1 folder (model_index.json: " +
        folder.model_index().get<std::string>("_class_name", "?") +
        "), whose transformer was not trained to edit: use a HiDream-E1 folder "
        "(HiDreamImageEditingPipeline), or give E1's weights with --e1-lora FILE (E1-Full) or "
        "--transformer");
  // What the flags leave open comes from the variant's reference settings.
  const auto defaults = pipeline::hidream_defaults(folder, f.variant);
  const int steps = f.steps.value_or(defaults.steps);
  const double cfg_scale = f.cfg_scale.value_or(defaults.guidance_scale);
  const double image_guidance = f.image_guidance.value_or(defaults.image_guidance_scale);
  const double refine = f.refine.value_or(f.e1_lora.empty() ? 0.0 : defaults.refine_strength);
  const auto mode = parallel_mode(f.parallel);
  if (f.parallel.world > 1) check_hidream_parallel_run(mode, f.parallel.world, edit, cfg_scale);
  if (f.parallel.is_launcher()) return run_parallel_launcher(f.parallel, f.seed.has_value());
  if (talk)
    std::cerr << "HiDream " << defaults.variant << ": " << steps << " steps, guidance " << cfg_scale
              << (edit ? ", image guidance " + c10::str(image_guidance) : "")
              << (refine > 0 ? ", refine " + c10::str(refine) : "") << "\n";
  const auto transformer = io::use_transformer_weights(folder, f.transformer);
  pipeline::HiDreamPipeline pipe(folder, device, dtype, transformer, placement);
  pipe.set_keep_text_encoders(false);  // one prompt per run: free them before the transformer
  pipe.set_weight_streaming(f.stream_weights);
  pipe.set_weight_type(f.weights);
  pipe.set_max_memory(max_memory_bytes(f.max_memory));
  if (!f.e1_lora.empty()) {
    adapters::LoraOptions lo;
    lo.alpha = f.lora_alpha;
    lo.rank = f.lora_rank;
    pipe.set_editing_lora(f.e1_lora, lo);
  }
  const auto lora_lines = apply_dit_flags(pipe, folder, f, talk);
  if (f.parallel.is_worker()) {
    const auto groups =
        join_groups(f.parallel, mode, dit_parallel_job(f, edit, seed, steps, cfg_scale));
    pipe.set_cfg_group(groups.cfg);
    pipe.set_sequence_group(groups.sequence);
  }
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Progress progress(!talk);
  pipeline::HiDreamSampling s;
  s.steps = steps;
  s.guidance_scale = cfg_scale;
  s.seed = seed;
  if (!f.latents_file.empty()) s.latents = read_tensor_file(f.latents_file, "latents");
  if (!f.step_noise_file.empty()) s.step_noise = read_step_noise_file(f.step_noise_file);
  s.vae_tiling = f.vae_tiling;
  s.cache = cache;
  const auto loop_start = std::chrono::steady_clock::now();
  StepCallback report = [&progress](const StepEvent& e) { return progress(e); };
  if (f.parallel.is_worker()) report = worker_step_callback(f.parallel, report);
  s.on_step = [&](const pipeline::HiDreamStep& st) {
    StepEvent e;
    e.step = st.index;
    e.num_steps = steps;
    e.timestep = st.t.item<double>();
    e.latents = &st.latents;
    e.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
    return report(e);
  };
  pipeline::HiDreamResult r;
  pipeline::ImageParameters params;
  params.prompt = f.prompt;
  params.negative_prompt = f.negative_prompt;
  params.steps = steps;
  params.scheduler = pipe.scheduler().class_name();
  params.cfg_scale = cfg_scale;
  params.seed = seed;
  params.model = f.model;
  params.device = device::device_name(device);
  params.dtype = device::dtype_name(dtype);
  if (edit) {
    pipeline::HiDreamEdit e;
    e.prompt = f.prompt;
    e.negative_prompt = f.negative_prompt;
    e.image = pipeline::image_to_tensor(source);
    e.image_guidance_scale = image_guidance;
    e.clip_cfg_norm = !f.no_clip_cfg_norm;
    e.refine_strength = refine;
    e.inpaint = mask_options;
    e.sampling = s;
    r = pipe.edit(e);
    params.image_guidance = image_guidance;
  } else {
    pipeline::HiDreamTextToImage t;
    t.prompt = f.prompt;
    t.negative_prompt = f.negative_prompt;
    t.width = f.width;
    t.height = f.height;
    t.area_side = f.area_side;
    t.sampling = s;
    r = pipe.text_to_image(t);
  }
  progress.finish();
  if (f.parallel.worker_rank > 0) return 0;  // rank 0 writes
  for (const auto& w : r.warnings) std::cerr << "warning: " << w << "\n";
  params.width = static_cast<int>(r.image.size(2));
  params.height = static_cast<int>(r.image.size(1));
  write_png(f.out, to_image(r.image), params.png_chunks());
  return finish_dit_run(
      f, {params, load_s, lora_lines, r.timings, cache, r.cache, pipe.quantized_layers()}, edit);
}

int finish_dit_run(const DitCliFlags& f, const DitRunReport& report, bool edit) {
  const auto& params = report.params;
  RunSummary summary;
  summary.files = {f.out};
  summary.seed = params.seed;
  summary.device = params.device;
  summary.dtype = params.dtype;
  summary.vae_dtype = device::dtype_name(torch::kFloat32);  // the Flux VAE's force_upcast
  summary.attention = nn::attention_backend_name(nn::default_attention_backend());
  summary.scheduler = params.scheduler;
  summary.load_s = report.load_s;
  summary.loras = report.loras;
  summary.runs = {report.timings};
  if (f.json) {
    std::cout << summary.json().dump(2) << "\n";
    return 0;
  }
  if (!f.quiet) {
    std::cerr << "wrote " << f.out << " (" << params.width << "x" << params.height << ", seed "
              << params.seed << ", " << params.scheduler << ")\n";
    summary.print(edit);
    if (report.cache.method != DitCacheOptions::Method::kOff)
      std::cerr << accel::dit_cache_summary(report.cache, report.cache_stats) << "\n";
    if (const auto& q = report.quantized; q.layers > 0)
      std::cerr << "weights " << f.weights << ": " << q.layers << " linear layers, "
                << q.plain_bytes / (1 << 20) << " MiB -> " << q.quantized_bytes / (1 << 20)
                << " MiB (" << q.kept_plain << " kept plain)\n";
  }
  std::cout << f.out << "\n";
  return 0;
}

namespace {

void add_flags(CLI::App& app, DitCliFlags& f, bool edit) {
  app.add_option("-m,--model", f.model,
                 edit ? "HiDream-E1 or FLUX.1 Kontext diffusers folder"
                      : "HiDream or FLUX.1 diffusers folder")
      ->required();
  app.add_option("-p,--prompt", f.prompt,
                 edit ? "Instruction (E1-Full form: 'Editing Instruction: ... Target Image "
                        "Description: ...')"
                      : "Prompt")
      ->required();
  app.add_option("-n,--negative-prompt", f.negative_prompt, "Negative prompt");
  app.add_option("--transformer", f.transformer,
                 "Component folder of the transformer weights, or a *.gguf/*.safetensors file "
                 "of its weights (e.g. a quantized GGUF; FLUX also in BFL's original names, as "
                 "flux1-dev.safetensors; config.json from the folder's transformer/)")
      ->capture_default_str();
  app.add_option("--variant", f.variant,
                 "auto|i1-full|i1-dev|i1-fast|e1|e1.1: the defaults of steps and guidance "
                 "(auto: from the folder's pipeline and scheduler)")
      ->capture_default_str()
      ->check(CLI::IsMember(pipeline::hidream_variant_names()));
  app.add_option("--steps", f.steps, "Denoising steps (default: the variant's)")
      ->check(int_range(1, 10000, "a number of steps"));
  app.add_option("--cfg-scale", f.cfg_scale,
                 "Text guidance scale, <= 1 disables it (default: the variant's)");
  app.add_option("-s,--seed", f.seed, "Seed (default: random)");
  app.add_option("--latents", f.latents_file,
                 "safetensors file with the initial latents (instead of the seed)");
  app.add_option("--step-noise", f.step_noise_file,
                 "safetensors file with noise.0, noise.1, ... for a stochastic scheduler's steps "
                 "(instead of the seed)");
  app.add_option("-o,--out", f.out, "Output PNG")->capture_default_str();
  app.add_option("--device", f.device, "auto|cpu|cuda[:N]|npu[:N]")
      ->capture_default_str()
      ->check(non_empty());
  app.add_option("--text-encoder-device", f.text_encoder_device,
                 "Device for the four text encoders (default: --device)")
      ->check(non_empty());
  app.add_option("--vae-device", f.vae_device, "Device for the VAE (default: --device)")
      ->check(non_empty());
  app.add_option("--dtype", f.dtype, "auto|fp32|bf16|fp16 for encoders and transformer")
      ->capture_default_str()
      ->check(non_empty());
  app.add_option("--stream-weights", f.stream_weights,
                 "Transformer blocks read from the weight files as they run: auto (when the "
                 "transformer does not fit in memory), on, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  add_max_memory_flag(app, f.max_memory);
  app.add_option("--weights", f.weights,
                 "Keep the transformer's linear weights quantized in memory: none, q8_0 (~53 % "
                 "of bf16's bytes), q4_0 (~28 %), dequantized per layer as it runs; int8 (~50 %), "
                 "multiplied in 8-bit integers on CPUs with AVX512-VNNI")
      ->capture_default_str()
      ->check(non_empty());
  app.add_option("--attention", f.attention, "auto|math|sdpa|flash|npu")
      ->capture_default_str()
      ->check(non_empty());
  add_vae_tiling_flags(app, f.vae_tiling);
  app.add_option("--cache", f.cache,
                 "Skip part of the transformer on some steps: off, fbcache[:THRESHOLD] (0.1), "
                 "taylorseer[:INTERVAL[:ORDER]] (3:1), ditcache[:FIRST:LAST[:INTERVAL]] (the "
                 "middle half of the single-stream blocks, every 2nd step)")
      ->capture_default_str();
  app.add_option("--scheduler", f.scheduler,
                 "flow_euler|flow_lcm|flash_flow_euler|unipc_flow|flow_unipc (default: the "
                 "folder's scheduler, with its config)");
  app.add_option_function<std::vector<std::string>>(
      "--lora",
      [&f](const std::vector<std::string>& values) {
        for (const auto& v : values) f.loras.push_back(parse_lora_flag(v));
      },
      "LoRA adapter PATH[:SCALE] on the transformer (peft, diffusers or kohya names; repeat for "
      "several)");
  app.add_flag("--lora-lenient", f.lora_lenient,
               "Warn about LoRA tensors that match no weight instead of failing");
  app.add_flag("-q,--quiet", f.quiet, "No progress output");
  app.add_flag("--json", f.json, "Print a JSON summary on stdout");
  app.add_option("--true-cfg-scale", f.true_cfg_scale,
                 "FLUX: above 1 with a negative prompt, a second transformer pass per step on it "
                 "(default 1: the guidance embedding alone)");
  app.add_option("--max-sequence-length", f.max_sequence_length,
                 "FLUX: T5 tokens of the prompt, 1..512 (default 512; schnell 256)");
  if (edit) {
    app.add_flag("--no-auto-resize", f.no_auto_resize,
                 "FLUX Kontext: keep the source's size (floored to multiples of 16) instead of "
                 "resizing it to the training resolution with the closest aspect ratio");
    app.add_option("-i,--image", f.image,
                   "Source image (PNG; scaled to the model's area, sides multiples of VAE factor x "
                   "patch, 16)")
        ->required();
    app.add_option("--image-guidance", f.image_guidance,
                   "Image guidance scale (default: the variant's)");
    app.add_option("--mask", f.mask,
                   "Keep the edit inside this mask (PNG: white = edit, black = keep the source)")
        ->check(CLI::ExistingFile);
    app.add_option("--mask-blur", f.mask_blur, "Blur the mask by this many pixels (sigma)")
        ->check(number_range(0, 256, "pixels"));
    app.add_flag("--invert-mask", f.invert_mask, "Edit the black part of the mask instead");
    app.add_option(
        "--refine", f.refine,
        "Refine strength in [0, 1]: the last steps run without the E1 LoRA on the target "
        "description (needs --e1-lora; default with it: the variant's)");
    app.add_option("--e1-lora", f.e1_lora,
                   "HiDream-E1-Full: peft LoRA file applied to the model's (I1) transformer");
    app.add_option("--lora-alpha", f.lora_alpha, "peft lora_alpha of --e1-lora (default: file)");
    app.add_option("--lora-rank", f.lora_rank, "peft r of --e1-lora (default: file)");
    app.add_flag("--no-clip-cfg-norm", f.no_clip_cfg_norm,
                 "Plain 3-branch guidance instead of E1's norm-capped text guidance");
  } else {
    app.add_option("-W,--width", f.width, "Width (rescaled to the model's area)")
        ->capture_default_str()
        ->check(int_range(1, 65536, "a width (the aspect ratio)"));
    app.add_option("-H,--height", f.height, "Height (rescaled to the model's area)")
        ->capture_default_str()
        ->check(int_range(1, 65536, "a height (the aspect ratio)"));
  }
}

}  // namespace

Command add_edit_command(CLI::App& app) {
  auto f = std::make_shared<DitCliFlags>();
  add_flags(app, *f, true);
  add_parallel_flags(app, f->parallel);
  return [f]() {
    DitCliFlags mine = *f;
    return run_parallel_command(mine.parallel, mine.device, mine.quiet, mine.json,
                                [&] { return run_hidream(mine, true); });
  };
}

}  // namespace diffuse::app
