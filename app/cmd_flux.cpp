// `diffuse txt2img` on a FLUX.1 folder and `diffuse edit` on a FLUX.1 Kontext folder:
// flags -> pipeline::FluxPipeline -> one PNG. The DiT flags that only HiDream honours are
// refused with the reason.
#include <torch/torch.h>

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
#include "memory_flags.h"
#include "nn/attention.h"
#include "pipeline/flux.h"
#include "pipeline/image_parameters.h"
#include "pipeline/stable_diffusion.h"
#include "progress.h"
#include "quant/quantized_weight.h"
#include "schedulers/scheduler.h"
#include "tensor_files.h"

namespace fs = std::filesystem;

namespace diffuse::app {
namespace {

void refuse_hidream_flags(const DitCliFlags& f) {
  auto refuse = [](const std::string& flag, const std::string& why) {
    throw InvalidArgument(flag + ": " + why);
  };
  if (f.variant != "auto") refuse("--variant " + f.variant, "HiDream's presets; not for FLUX");
  if (f.area_side) refuse("--area-side", "HiDream's area; FLUX renders -W x -H");
  if (f.image_guidance) refuse("--image-guidance", "HiDream-E1's; Kontext has no image guidance");
  if (f.refine || !f.e1_lora.empty() || f.lora_alpha || f.lora_rank)
    refuse("--refine/--e1-lora/--lora-alpha/--lora-rank", "HiDream-E1-Full's refine phase");
  if (f.no_clip_cfg_norm) refuse("--no-clip-cfg-norm", "HiDream-E1's guidance");
  if (!f.text_encoder_device.empty() || !f.vae_device.empty())
    refuse("--text-encoder-device/--vae-device",
           "FLUX runs its stages on --device (placement per stage is HiDream's so far)");
  if (!f.step_noise_file.empty())
    refuse("--step-noise", "FLUX's Euler scheduler draws no noise per step");
  if (f.max_sequence_length && (*f.max_sequence_length < 1 || *f.max_sequence_length > 512))
    refuse("--max-sequence-length",
           "T5 tokens must be in 1..512, got " + std::to_string(*f.max_sequence_length));
  if (f.true_cfg_scale && !(*f.true_cfg_scale >= 0.0 && *f.true_cfg_scale <= 100.0))
    refuse("--true-cfg-scale", "must be in [0, 100], got " + c10::str(*f.true_cfg_scale));
  if (f.cfg_scale && !(*f.cfg_scale >= 0.0 && *f.cfg_scale <= 100.0))
    refuse("--cfg-scale", "must be in [0, 100], got " + c10::str(*f.cfg_scale));
}

}  // namespace

int run_flux(const DitCliFlags& f, bool edit) {
  io::check_output_path(f.out, "output");
  if (fs::path(f.out).extension() != ".png")
    throw InvalidArgument("-o/--out '" + f.out +
                          "': only PNG output is supported (use a .png name)");
  refuse_hidream_flags(f);
  quant::parse_weight_type(f.weights, "--weights");  // refused before the load
  const auto cache = accel::parse_dit_cache(dit_cache_flag(f));
  if (f.parallel.active() && parallel_mode(f.parallel) != ParallelMode::kUlysses)
    throw InvalidArgument(
        "--devices/--parallel cfg: FLUX's guidance is one embedding (true CFG's negative pass "
        "rides in the same batch); FLUX shares its work over ranks with --parallel ulysses");
  require_shared_seed(f.parallel, f.seed.has_value());
  if (f.parallel.is_launcher()) return run_parallel_launcher(f.parallel, f.seed.has_value());
  const bool img2img = !edit && !f.image.empty();
  Image source;
  if (edit && f.image.empty()) throw InvalidArgument("edit needs a source image (-i/--image)");
  if (!f.image.empty()) source = read_png(f.image);
  if (!f.mask.empty() && !edit && !img2img)
    throw InvalidArgument("--mask: repaints part of a source image (img2img -i, or edit)");
  const auto mask_options = dit_mask_options(f);  // read before anything loads
  const auto device =
      device::resolve_device(f.parallel.is_worker() ? f.parallel.rank_device : f.device);
  const auto dtype = device::resolve_dtype(f.dtype, device, "transformer");
  nn::set_default_attention_backend(nn::attention_backend_from_flag_or_env(f.attention, device));
  const uint64_t seed = f.seed ? parse_seed(*f.seed, "--seed") : std::random_device{}();
  const bool talk = !f.quiet && !f.json;

  if (talk) std::cerr << "loading " << f.model << " ...\n";
  const auto t0 = std::chrono::steady_clock::now();
  auto folder = io::ModelFolder::open(f.model);
  if (!f.scheduler.empty()) check_flow_scheduler_name(f.scheduler);
  // A component folder, or one file: diffusers names, or BFL's (flux1-dev.safetensors).
  const auto transformer = io::use_transformer_weights(folder, f.transformer);
  pipeline::FluxPipeline pipe(folder, device, dtype, transformer);
  if (edit && !pipe.is_kontext())
    throw InvalidArgument(f.model + " is a FLUX.1 text-to-image folder (model_index.json: " +
                          folder.model_index().get<std::string>("_class_name", "?") +
                          "); instruction editing needs FLUX.1 Kontext (FluxKontextPipeline)");
  pipe.set_keep_text_encoders(false);  // one prompt per run: free them before the transformer
  pipe.set_weight_type(f.weights);
  pipe.set_weight_streaming(f.stream_weights);
  pipe.set_max_memory(max_memory_bytes(f.max_memory));
  const auto lora_lines = apply_dit_flags(pipe, folder, f, talk);
  // The references' defaults: FLUX.1-dev 28 steps at guidance 3.5 (Kontext 2.5), schnell
  // (no guidance embedding) 4 steps and 256 T5 tokens.
  const bool distilled_guidance = pipe.transformer_config().guidance_embeds;
  pipeline::FluxSampling s;
  s.steps = f.steps.value_or(distilled_guidance ? 28 : 4);
  s.guidance_scale = f.cfg_scale.value_or(pipe.is_kontext() ? 2.5 : 3.5);
  s.true_cfg_scale = f.true_cfg_scale.value_or(1.0);
  s.max_sequence_length = f.max_sequence_length.value_or(distilled_guidance ? 512 : 256);
  s.seed = seed;
  if (!f.latents_file.empty()) s.latents = read_tensor_file(f.latents_file, "latents");
  s.vae_tiling = f.vae_tiling;
  s.cache = cache;
  if (f.parallel.is_worker())
    pipe.set_sequence_group(join_group(f.parallel, "Ulysses",
                                       dit_parallel_job(f, edit, seed, s.steps, s.guidance_scale)));
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (talk)
    std::cerr << "FLUX" << (pipe.is_kontext() ? " Kontext" : "") << ": " << s.steps
              << " steps, guidance "
              << (distilled_guidance ? c10::str(s.guidance_scale) : std::string("none (schnell)"))
              << (s.true_cfg_scale > 1 ? ", true CFG " + c10::str(s.true_cfg_scale) : "") << "\n";
  Progress progress(!talk);
  const auto loop_start = std::chrono::steady_clock::now();
  StepCallback report = [&progress](const StepEvent& e) { return progress(e); };
  if (f.parallel.is_worker()) report = worker_step_callback(f.parallel, report);
  s.on_step = [&](const pipeline::FluxStep& st) {
    StepEvent e;
    e.step = st.index;
    e.num_steps = s.steps;
    e.timestep = st.t.item<double>();
    e.latents = &st.latents;
    e.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
    return report(e);
  };
  std::optional<std::string> negative;
  if (!f.negative_prompt.empty()) negative = f.negative_prompt;
  pipeline::FluxResult r;
  if (img2img) {
    pipeline::FluxImageToImage i;
    i.prompt = f.prompt;
    i.negative_prompt = negative;
    i.image = pipeline::image_to_tensor(source);
    i.width = f.width;  // 0: the image's (txt2img's img2img route passes what was given)
    i.height = f.height;
    i.strength = f.strength;
    i.inpaint = mask_options;
    i.sampling = s;
    r = pipe.image_to_image(i);
  } else if (edit) {
    pipeline::FluxEdit e;
    e.prompt = f.prompt;
    e.negative_prompt = negative;
    e.image = pipeline::image_to_tensor(source);
    e.max_area = 0;  // the output keeps the (resized) source's size
    e.auto_resize = !f.no_auto_resize;
    e.inpaint = mask_options;
    e.sampling = s;
    r = pipe.edit(e);
  } else {
    pipeline::FluxTextToImage t;
    t.prompt = f.prompt;
    t.negative_prompt = negative;
    t.width = f.width;
    t.height = f.height;
    t.sampling = s;
    r = pipe.text_to_image(t);
  }
  progress.finish();
  if (f.parallel.worker_rank > 0) return 0;  // rank 0 writes
  for (const auto& w : r.warnings) std::cerr << "warning: " << w << "\n";
  pipeline::ImageParameters params;
  params.prompt = f.prompt;
  params.negative_prompt = f.negative_prompt;
  params.steps = s.steps;
  params.scheduler = pipe.scheduler().class_name();
  params.cfg_scale = s.guidance_scale;
  params.seed = seed;
  params.model = f.model;
  params.device = device::device_name(device);
  params.dtype = device::dtype_name(dtype);
  if (img2img) params.strength = f.strength;
  params.width = static_cast<int>(r.image.size(2));
  params.height = static_cast<int>(r.image.size(1));
  write_png(f.out, pipeline::to_images(r.image)[0], params.png_chunks());
  return finish_dit_run(
      f, {params, load_s, lora_lines, r.timings, cache, r.cache, pipe.quantized_layers()},
      edit || img2img);
}

}  // namespace diffuse::app
