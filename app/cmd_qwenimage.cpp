// `diffuse txt2img` on a Qwen-Image folder and `diffuse edit` on a Qwen-Image-Edit folder:
// flags -> pipeline::QwenImagePipeline -> one PNG. Flags of the other DiT families are refused
// with the reason.
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>

#include "accel/dit_cache.h"
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
#include "pipeline/image_parameters.h"
#include "pipeline/qwenimage.h"
#include "pipeline/stable_diffusion.h"
#include "progress.h"
#include "quant/quantized_weight.h"
#include "tensor_files.h"

namespace fs = std::filesystem;

namespace diffuse::app {
namespace {

void refuse_other_family_flags(const DitCliFlags& f, bool edit) {
  auto refuse = [](const std::string& flag, const std::string& why) {
    throw InvalidArgument(flag + ": " + why);
  };
  if (f.variant != "auto")
    refuse("--variant " + f.variant, "HiDream's presets; not for Qwen-Image");
  if (f.image_guidance) refuse("--image-guidance", "HiDream-E1's; Qwen-Image-Edit has none");
  if (f.area_side) refuse("--area-side", "HiDream's area; Qwen-Image renders -W x -H");
  if (f.refine || !f.e1_lora.empty() || f.lora_alpha || f.lora_rank)
    refuse("--refine/--e1-lora/--lora-alpha/--lora-rank", "HiDream-E1-Full's refine phase");
  if (f.no_clip_cfg_norm) refuse("--no-clip-cfg-norm", "HiDream-E1's guidance");
  if (!f.text_encoder_device.empty() || !f.vae_device.empty())
    refuse("--text-encoder-device/--vae-device",
           "Qwen-Image runs its stages on --device (placement per stage is HiDream's so far)");
  if (!f.step_noise_file.empty())
    refuse("--step-noise", "Qwen-Image's Euler scheduler draws no noise per step");
  if (f.no_auto_resize)
    refuse("--no-auto-resize", "Qwen-Image-Edit always shows Qwen2.5-VL the source at ~1 MP");
  if (f.max_sequence_length && (*f.max_sequence_length < 1 || *f.max_sequence_length > 1024))
    refuse("--max-sequence-length", "Qwen-Image keeps 1..1024 prompt embeddings, got " +
                                        std::to_string(*f.max_sequence_length));
  for (const auto& [flag, value] :
       {std::pair<const char*, std::optional<double>>{"--true-cfg-scale", f.true_cfg_scale},
        {"--cfg-scale", f.cfg_scale}})
    if (value && !(*value >= 0.0 && *value <= 100.0))
      refuse(flag, "must be in [0, 100], got " + c10::str(*value));
  if (f.true_cfg_scale && f.cfg_scale && *f.true_cfg_scale != *f.cfg_scale)
    refuse("--cfg-scale/--true-cfg-scale",
           "Qwen-Image has one guidance scale (true CFG): give one");
  if (!edit && !f.image.empty())
    refuse("-i/--image",
           "Qwen-Image draws from text; editing a picture is `diffuse edit` on a "
           "Qwen-Image-Edit folder");
  if (!edit && !f.mask.empty()) refuse("--mask", "repaints part of a source: `diffuse edit`");
  if (f.mask_crop >= 0) refuse("--mask-crop", "an edit sees the whole source");
  if (f.parallel.active()) {
    const auto mode = parallel_mode(f.parallel);
    if (mode == ParallelMode::kCfgUlysses)
      refuse("--parallel cfg,ulysses",
             "Qwen-Image runs --parallel cfg (2 ranks: one true-CFG branch each) or --parallel "
             "ulysses");
    if (mode == ParallelMode::kCfg && f.parallel.world != 2)
      refuse("--parallel cfg", "Qwen-Image's true CFG has two branches: run it on 2 ranks, not " +
                                   std::to_string(f.parallel.world));
  }
}

}  // namespace

int run_qwenimage(const DitCliFlags& f, bool edit) {
  io::check_output_path(f.out, "output");
  if (fs::path(f.out).extension() != ".png")
    throw InvalidArgument("-o/--out '" + f.out +
                          "': only PNG output is supported (use a .png name)");
  refuse_other_family_flags(f, edit);
  quant::parse_weight_type(f.weights, "--weights");  // refused before the load
  const auto cache = accel::parse_dit_cache(dit_cache_flag(f));
  require_shared_seed(f.parallel, f.seed.has_value());
  if (f.parallel.is_launcher()) return run_parallel_launcher(f.parallel, f.seed.has_value());
  Image source;
  if (edit && f.image.empty()) throw InvalidArgument("edit needs a source image (-i/--image)");
  if (!f.image.empty()) source = read_png(f.image);
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
  const auto transformer = io::use_transformer_weights(folder, f.transformer);
  pipeline::QwenImagePipeline pipe(folder, device, dtype, transformer);
  if (edit && !pipe.is_edit_model())
    throw InvalidArgument(f.model + " is a Qwen-Image text-to-image folder (model_index.json: " +
                          folder.model_index().get<std::string>("_class_name", "?") +
                          "); instruction editing needs Qwen-Image-Edit (QwenImageEditPipeline)");
  pipe.set_keep_text_encoders(false);  // one prompt per run: free it before the transformer
  pipe.set_weight_type(f.weights);
  pipe.set_weight_streaming(f.stream_weights);
  pipe.set_max_memory(max_memory_bytes(f.max_memory));
  const auto lora_lines = apply_dit_flags(pipe, folder, f, talk);
  // QwenImagePipeline's defaults: 50 steps, true CFG 4 (on a " " negative prompt when none is
  // given, as the model cards run it: without one the reference skips guidance altogether).
  pipeline::QwenImageSampling s;
  s.steps = f.steps.value_or(50);
  s.true_cfg_scale = f.true_cfg_scale.value_or(f.cfg_scale.value_or(4.0));
  s.max_sequence_length = f.max_sequence_length.value_or(512);
  s.seed = seed;
  if (!f.latents_file.empty()) s.latents = read_tensor_file(f.latents_file, "latents");
  s.cache = cache;
  pipe.check_cache(cache);
  if (f.parallel.is_worker()) {
    const auto groups = join_groups(f.parallel, parallel_mode(f.parallel),
                                    dit_parallel_job(f, edit, seed, s.steps, s.true_cfg_scale));
    pipe.set_cfg_group(groups.cfg);
    pipe.set_sequence_group(groups.sequence);
  }
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (talk)
    std::cerr << "Qwen-Image" << (edit ? "-Edit" : "") << ": " << s.steps << " steps, true CFG "
              << (s.true_cfg_scale > 1 ? c10::str(s.true_cfg_scale) : std::string("off")) << "\n";
  Progress progress(!talk);
  const auto loop_start = std::chrono::steady_clock::now();
  StepCallback report = [&progress](const StepEvent& e) { return progress(e); };
  if (f.parallel.is_worker()) report = worker_step_callback(f.parallel, report);
  s.on_step = [&](const pipeline::QwenImageStep& st) {
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
  if (!f.negative_prompt.empty())
    negative = f.negative_prompt;
  else if (s.true_cfg_scale > 1)
    negative = " ";
  pipeline::QwenImageResult r;
  if (edit) {
    pipeline::QwenImageEdit e;
    e.prompt = f.prompt;
    e.negative_prompt = negative;
    e.image = pipeline::image_to_tensor(source);
    e.inpaint = mask_options;
    e.sampling = s;
    r = pipe.edit(e);
  } else {
    pipeline::QwenImageTextToImage t;
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
  params.negative_prompt = negative.value_or("");
  params.steps = s.steps;
  params.scheduler = pipe.scheduler().class_name();
  params.cfg_scale = s.true_cfg_scale;
  params.seed = seed;
  params.model = f.model;
  params.device = device::device_name(device);
  params.dtype = device::dtype_name(dtype);
  params.width = static_cast<int>(r.image.size(2));
  params.height = static_cast<int>(r.image.size(1));
  write_png(f.out, pipeline::to_images(r.image)[0], params.png_chunks());
  return finish_dit_run(
      f, {params, load_s, lora_lines, r.timings, cache, r.cache, pipe.quantized_layers()}, edit);
}

}  // namespace diffuse::app
