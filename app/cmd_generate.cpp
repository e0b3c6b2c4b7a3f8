// `diffuse txt2img` and `diffuse img2img`: flags -> GenerationConfig -> PNG files.
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "accel/dit_cache.h"
#include "accel_flags.h"
#include "commands.h"
#include "device/cpu_load.h"
#include "device/device.h"
#include "diffuse/pipeline.h"
#include "flag_checks.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "load_flags.h"
#include "nn/attention.h"
#include "parallel_flags.h"
#include "pipeline/controlnet_step.h"
#include "pipeline/cpu_report.h"
#include "pipeline/flux.h"
#include "pipeline/hidream.h"
#include "pipeline/image_parameters.h"
#include "pipeline/inpaint_mask.h"
#include "pipeline/memory_report.h"
#include "pipeline/model_source.h"
#include "pipeline/prompt_loras.h"
#include "pipeline/qwenimage.h"
#include "pipeline/stable_diffusion.h"
#include "progress.h"
#include "run_summary.h"
#include "tensor_files.h"
#include "vae_tiling_flags.h"

namespace fs = std::filesystem;

namespace diffuse::app {
namespace {

struct GenerateFlags {
  std::string model;
  std::vector<std::string> prompts;
  std::vector<std::string> negative_prompts;
  int width = 0, height = 0;
  int steps = 25;
  double cfg_scale = 7.5;
  bool steps_given = false, cfg_given = false;  // on the command line (HiDream: else its defaults)
  bool prompt_syntax_given = false;
  std::optional<std::string> seed;
  std::string scheduler;
  double strength = 0.8;
  std::string init_image;
  int num_images = 1;
  int batch_count = 1;
  std::string out = "output.png";
  std::string latents_file, noise_file;
  double denoising_start = 0.0, denoising_end = 1.0;  // SDXL base -> refiner handoff
  std::string prompt_syntax = "a1111";
  std::string lora_dir;
  std::string transformer;  // HiDream/FLUX: the transformer's folder or file (DitCliFlags)
  LoadFlags load;
  ParallelFlags parallel;
  AccelFlags accel;
  VaeTilingOptions vae_tiling;
  // SDXL micro-conditioning, as typed ("1024x1024", "0,0"); empty = the image's own.
  std::string original_size, target_size, crop_top_left;
  std::optional<double> aesthetic_score, negative_aesthetic_score;
  // FLUX (DitCliFlags' meaning); refused on other models.
  std::optional<double> true_cfg_scale;
  int area_side = 0;
  std::optional<int64_t> max_sequence_length;
  // Inpainting (img2img) and ControlNets.
  std::string mask;
  double mask_blur = 0;
  bool invert_mask = false;
  int mask_crop = -1;
  std::string inpaint_fill = "original";
  std::vector<std::string> controlnets, control_images;
  std::vector<double> control_scales;
  std::vector<std::string> control_preprocess;
  double control_start = 0, control_end = 1;
  bool guess_mode = false;
  bool quiet = false;
  bool json = false;
};

// Beyond these a run is a typo, not a wish: each would size memory or work without bound.
constexpr int64_t kMaxSide = 8192;  // as validate_generation_config
constexpr int64_t kMaxSteps = 10000;
constexpr int64_t kMaxBatch = 256;  // images of one batch, held in memory together
constexpr int64_t kMaxBatchCount = 100000;

void add_common_flags(CLI::App& app, GenerateFlags& f, bool img2img) {
  app.add_option("-m,--model", f.model, "Diffusers folder or single-file .safetensors checkpoint")
      ->required();
  app.add_option("-p,--prompt", f.prompts, "Prompt (repeat for a batch of prompts)")->required();
  app.add_option("-n,--negative-prompt", f.negative_prompts,
                 "Negative prompt (one, or one per prompt)");
  app.add_option("-W,--width", f.width, "Width in pixels, multiple of 8 (default: the model's)")
      ->check(int_range(8, kMaxSide, "a width in pixels"));
  app.add_option("-H,--height", f.height, "Height in pixels, multiple of 8 (default: the model's)")
      ->check(int_range(8, kMaxSide, "a height in pixels"));
  app.add_option("--steps", f.steps, "Denoising steps")
      ->capture_default_str()
      ->check(int_range(1, kMaxSteps, "a number of steps"));
  app.add_option("--cfg-scale", f.cfg_scale, "Classifier-free guidance scale (<= 1 disables it)")
      ->capture_default_str();
  app.add_option("-s,--seed", f.seed,
                 "Seed (default: random); same seed, same image on every device");
  app.add_option("--prompt-syntax", f.prompt_syntax,
                 "a1111: (word:1.3) weights, BREAK, prompts past 77 tokens; plain: as diffusers")
      ->capture_default_str()
      ->check(CLI::IsMember({"a1111", "plain"}));
  app.add_option("--lora-dir", f.lora_dir,
                 "Folder of LoRA files that <lora:NAME:SCALE> in a prompt refers to (a1111 syntax)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--scheduler", f.scheduler,
                 "ddim|pndm|euler|euler_a|dpmpp_2m|lms (default: the model's)");
  app.add_option("--num-images", f.num_images, "Images per prompt in one batch")
      ->capture_default_str()
      ->check(int_range(1, kMaxBatch, "images per prompt"));
  app.add_option("--batch-count", f.batch_count, "Repeat the generation with seed+1, seed+2, ...")
      ->capture_default_str()
      ->check(int_range(1, kMaxBatchCount, "a batch count"));
  app.add_option("-o,--out", f.out, "Output PNG (numbered when several images)")
      ->capture_default_str();
  app.add_option("--transformer", f.transformer,
                 "HiDream/FLUX: component folder of the transformer weights, or one "
                 "*.safetensors/*.gguf file of them (FLUX also in BFL's original names); Stable "
                 "Diffusion takes --unet FILE")
      ->check(non_empty());
  app.add_option("--true-cfg-scale", f.true_cfg_scale,
                 "FLUX: above 1 with a negative prompt, a second transformer pass per step on it");
  app.add_option("--area-side", f.area_side,
                 "HiDream: the side of the square whose area the image keeps, its shape from "
                 "-W/-H (default: the model's, 1024; smaller for quick runs)")
      ->check(CLI::Range(64, 4096));
  app.add_option("--max-sequence-length", f.max_sequence_length,
                 "FLUX: T5 tokens of the prompt, 1..512 (default 512; schnell 256)");
  app.add_option("--original-size", f.original_size,
                 "SDXL: the size WxH the UNet is told the image was taken at (default: its own)")
      ->check(non_empty());
  app.add_option("--target-size", f.target_size,
                 "SDXL: the size WxH the UNet is told to aim at (default: the image's)")
      ->check(non_empty());
  app.add_option("--crop-top-left", f.crop_top_left,
                 "SDXL: the crop Y,X the UNet is told the image was cut at (default: 0,0)")
      ->check(non_empty());
  app.add_option("--aesthetic-score", f.aesthetic_score,
                 "SDXL refiners: the score the image is conditioned on (default: 6)")
      ->check(number_range(-1000, 1000, "a score"));
  app.add_option("--negative-aesthetic-score", f.negative_aesthetic_score,
                 "SDXL refiners: the negative branch's score (default: 2.5)")
      ->check(number_range(-1000, 1000, "a score"));
  add_load_flags(app, f.load);
  add_accel_flags(app, f.accel);
  add_vae_tiling_flags(app, f.vae_tiling);
  app.add_flag("-q,--quiet", f.quiet, "No progress output");
  app.add_flag("--json", f.json, "Print a JSON summary on stdout");
  add_parallel_flags(app, f.parallel);
  app.add_option("--denoising-end", f.denoising_end,
                 "Stop at this fraction of the schedule and write the latents, undecoded, to "
                 "-o FILE.safetensors for the next expert (SDXL base -> refiner; diffusers' "
                 "denoising_end)")
      ->check(number_range(0, 1, "a fraction"));
  if (img2img) {
    app.add_option("-i,--init-image", f.init_image,
                   "Input PNG image (not with --denoising-start, which continues from --latents)");
    app.add_option("--denoising-start", f.denoising_start,
                   "Continue another run's latents (--latents FILE, from txt2img --denoising-end) "
                   "from this fraction of the schedule, adding no noise (the SDXL refiner's "
                   "denoising_start)")
        ->check(number_range(0, 1, "a fraction"));
    app.add_option("--latents", f.latents_file,
                   "safetensors file with the latents --denoising-start continues from");
    app.add_option("--strength", f.strength, "How far to move from the init image, in (0, 1]")
        ->capture_default_str();
    app.add_option("--mask", f.mask,
                   "Inpainting mask PNG: white = repaint, black = keep, grey = partly (resized "
                   "to the image as diffusers does)")
        ->check(CLI::ExistingFile);
    app.add_option("--mask-blur", f.mask_blur, "Blur the mask by this many pixels (sigma)")
        ->check(number_range(0, 256, "pixels"));
    app.add_flag("--invert-mask", f.invert_mask, "Repaint the black part of the mask instead");
    app.add_option("--mask-crop", f.mask_crop,
                   "Inpaint only the masked area: work at full size on the box around the mask, "
                   "widened by this many pixels, and paste it back (A1111's 'only masked')")
        ->check(int_range(0, kMaxSide, "a padding in pixels"));
    app.add_option("--inpaint-fill", f.inpaint_fill,
                   "What the masked region starts from below strength 1: original (the "
                   "source), fill (painted from its surroundings), latent_noise, latent_nothing")
        ->capture_default_str()
        ->check(CLI::IsMember({"original", "fill", "latent_noise", "latent_nothing"}));
    app.add_option("--noise", f.noise_file,
                   "safetensors file with the noise added to the init image's latents (instead "
                   "of the seed's)");
  } else {
    app.add_option("--latents", f.latents_file,
                   "safetensors file with the initial latents (instead of the seed)");
  }
  app.add_option("--controlnet", f.controlnets,
                 "ControlNet folder (diffusers layout; repeat for several, each with its "
                 "--control-image)");
  app.add_option("--control-image", f.control_images,
                 "Control image PNG of each --controlnet, in order (resized to the output)")
      ->check(CLI::ExistingFile);
  app.add_option("--control-scale", f.control_scales,
                 "Conditioning scale: one for all ControlNets or one each (default 1)");
  app.add_option("--control-preprocess", f.control_preprocess,
                 "Preprocess the control image: none, canny or canny:LOW:HIGH (OpenCV's edges, "
                 "100:200 by default); one for all ControlNets or one each");
  app.add_option("--control-start", f.control_start,
                 "Fraction of the steps at which the ControlNets start acting")
      ->check(number_range(0, 1, "a fraction"));
  app.add_option("--control-end", f.control_end,
                 "Fraction of the steps at which the ControlNets stop acting")
      ->check(number_range(0, 1, "a fraction"));
  app.add_flag("--guess-mode", f.guess_mode,
               "ControlNets see the conditional branch only (diffusers' guess_mode)");
}

// A per-ControlNet flag given once for all of them or once each: InvalidArgument otherwise.
template <typename T>
void check_one_or_each(const char* flag, const std::vector<T>& values, size_t nets) {
  if (values.size() > 1 && values.size() != nets)
    throw InvalidArgument(std::string(flag) + ": give one for all ControlNets or one each (" +
                          std::to_string(nets) + "), got " + std::to_string(values.size()));
}
// Unit j's value of such a flag (given: not empty).
template <typename T>
const T& one_or_each(const std::vector<T>& values, size_t j) {
  return values.size() == 1 ? values[0] : values[j];
}

// --controlnet/--control-image/--control-scale as the generation's ControlNet units; images
// read here, so that a bad file fails before any weight loads.
std::vector<ControlNetUnit> controlnet_units(const GenerateFlags& f) {
  if (f.controlnets.size() != f.control_images.size())
    throw InvalidArgument("--controlnet: " + std::to_string(f.controlnets.size()) +
                          " ControlNet(s) but " + std::to_string(f.control_images.size()) +
                          " --control-image(s): give one control image per ControlNet");
  check_one_or_each("--control-scale", f.control_scales, f.controlnets.size());
  check_one_or_each("--control-preprocess", f.control_preprocess, f.controlnets.size());
  if (f.controlnets.empty() && (!f.control_scales.empty() || !f.control_preprocess.empty() ||
                                f.guess_mode || f.control_start > 0 || f.control_end < 1))
    throw InvalidArgument(
        "--control-scale/--control-preprocess/--control-start/--control-end/--guess-mode need a "
        "--controlnet");
  std::vector<ControlNetUnit> units;
  for (size_t j = 0; j < f.controlnets.size(); ++j) {
    ControlNetUnit u;
    u.model = f.controlnets[j];
    const auto img = read_png(f.control_images[j]);
    u.image = pipeline::image_to_tensor(img);
    if (!f.control_scales.empty()) u.scale = one_or_each(f.control_scales, j);
    if (!f.control_preprocess.empty()) u.preprocess = one_or_each(f.control_preprocess, j);
    u.start = f.control_start;
    u.end = f.control_end;
    units.push_back(std::move(u));
  }
  pipeline::validate_controlnet_units(units);  // before any weight loads
  return units;
}

std::string output_path(const std::string& out, size_t index, size_t total) {
  if (total <= 1) return out;
  fs::path p(out);
  std::string ext = p.has_extension() ? p.extension().string() : ".png";
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(index) + ext)).string();
}

int run_generate(const GenerateFlags& f, bool img2img);

// The txt2img flags a HiDream or FLUX (`family`) folder cannot honour are refused, each saying why:
// none is dropped without a word (issue 36).
void check_hidream_generate_flags(const GenerateFlags& f, const std::string& family) {
  auto refuse = [](const std::string& flag, const std::string& why) {
    throw InvalidArgument(flag + ": " + why);
  };
  if (f.prompts.size() != 1 || f.negative_prompts.size() > 1 || f.num_images != 1 ||
      f.batch_count != 1)
    throw InvalidArgument(family + " models take one prompt and one image per run");
  if (f.denoising_end < 1 || f.denoising_start > 0)
    refuse("--denoising-end/--denoising-start",
           "the expert handoff is for UNet models (SDXL base -> refiner); " + family +
               " models run their whole schedule");
  if (!f.mask.empty() && family != "FLUX")
    refuse("--mask", family +
                         " models repaint a masked region in their edits (diffuse edit --mask); "
                         "image-to-image with a mask is for Stable Diffusion and FLUX");
  if (!f.controlnets.empty())
    refuse("--controlnet",
           "ControlNets steer UNet models (Stable Diffusion 1.x/2.x/XL); " + family + " has none");
  if (f.accel.graph)
    refuse("--graph", "it replays a UNet step; " + family +
                          " models have none (their step is long enough on a GPU not to wait on "
                          "the host)");
  if (any_accel_flag(f.accel))
    refuse("--deepcache/--tome", "they accelerate a UNet; " + family + " models have none");
  if (f.prompt_syntax_given && f.prompt_syntax != "plain")
    refuse("--prompt-syntax " + f.prompt_syntax,
           family +
               "'s T5-based text encoders take the prompt as written (plain); A1111 "
               "weights are for CLIP-only UNet models");
  if (!f.lora_dir.empty())
    refuse("--lora-dir", "<lora:NAME:SCALE> tags are A1111 prompt syntax, which " + family +
                             " prompts do not use; "
                             "give the file with --lora PATH[:SCALE]");
  const auto& l = f.load;
  if (l.vae_dtype != "auto" && l.vae_dtype != "fp32")
    refuse("--vae-dtype " + l.vae_dtype, family + "'s Flux VAE runs in float32 (force_upcast)");
  if (!l.unet_file.empty())
    refuse("--unet", "a Stable Diffusion UNet file; " + family +
                         " folders take their transformer's file with --transformer FILE");
  if (l.widen_weights) refuse("--widen-weights", "a Stable Diffusion UNet option");
  if (l.no_pack_weights) refuse("--no-pack-weights", "a Stable Diffusion UNet option");
  if (l.lora_mode != "merged")
    refuse("--lora-mode " + l.lora_mode, "LoRAs on " + family + "'s transformer are merged");
  if (!l.config_dir.empty() || l.v_prediction || l.epsilon)
    refuse("--config/--v-prediction/--epsilon",
           "they describe single-file Stable Diffusion checkpoints; a " + family +
               " folder has its "
               "own configs");
  if (!f.noise_file.empty()) refuse("--noise", "an img2img option");
  if (!f.original_size.empty() || !f.target_size.empty() || !f.crop_top_left.empty() ||
      f.aesthetic_score || f.negative_aesthetic_score)
    refuse("--original-size/--target-size/--crop-top-left/--aesthetic-score",
           "SDXL's micro-conditioning; " + family + "'s transformer takes no size or score");
}

// The SDXL micro-conditioning flags, read into `c` (InvalidArgument naming the flag).
void apply_size_conditioning_flags(const GenerateFlags& f, SizeConditioning& c) {
  constexpr int kMax = 16384;  // as validate_size_conditioning
  if (!f.original_size.empty())
    std::tie(c.original_width, c.original_height) =
        parse_int_pair(f.original_size, 'x', 1, kMax, "--original-size");
  if (!f.target_size.empty())
    std::tie(c.target_width, c.target_height) =
        parse_int_pair(f.target_size, 'x', 1, kMax, "--target-size");
  if (!f.crop_top_left.empty())
    std::tie(c.crop_top, c.crop_left) =
        parse_int_pair(f.crop_top_left, ',', 0, kMax, "--crop-top-left");
  if (f.aesthetic_score) c.aesthetic_score = *f.aesthetic_score;
  if (f.negative_aesthetic_score) c.negative_aesthetic_score = *f.negative_aesthetic_score;
}

// What the ranks of a Stable Diffusion run must agree on (parallel/process_group.h).
std::string parallel_job(const GenerateFlags& f, const GenerationConfig& g, bool img2img) {
  std::string prompts, negatives;
  for (const auto& p : g.prompts) prompts += p + "\x1f";
  for (const auto& p : g.negative_prompts) negatives += p + "\x1f";
  return parallel_job_lines(
      // Every rank has a seed: the launcher fixes one, require_shared_seed asks for one.
      f.parallel, f.model, g.seed.value_or(0),
      {{"command", img2img ? "img2img" : "txt2img"},
       {"prompts", prompts},
       {"negative prompts", negatives},
       {"size", std::to_string(g.width) + "x" + std::to_string(g.height)},
       {"steps", std::to_string(g.steps)},
       {"guidance", c10::str(g.guidance_scale)},
       {"images", std::to_string(g.images_per_prompt) + " x " + std::to_string(f.batch_count)}});
}

// A rank of a parallel run runs the command as given, ranks other than 0 quietly.
int run_command(const GenerateFlags& given, bool img2img) {
  GenerateFlags f = given;
  return run_parallel_command(f.parallel, f.load.device, f.quiet, f.json,
                              [&] { return run_generate(f, img2img); });
}

int run_generate(const GenerateFlags& f, bool img2img) {
  if (f.batch_count < 1)
    throw InvalidArgument("--batch-count must be >= 1, got " + std::to_string(f.batch_count));
  GenerationConfig g;
  g.prompts = f.prompts;
  g.negative_prompts = f.negative_prompts;
  g.width = f.width;
  g.height = f.height;
  g.steps = f.steps;
  g.guidance_scale = f.cfg_scale;
  g.strength = f.strength;
  g.denoising_start = f.denoising_start;
  g.denoising_end = f.denoising_end;
  g.images_per_prompt = f.num_images;
  g.scheduler = f.scheduler;
  g.prompt_syntax = f.prompt_syntax;
  if (f.seed) g.seed = parse_seed(*f.seed, "--seed");
  apply_accel_flags(f.accel, g);
  g.vae_tiling = f.vae_tiling;
  apply_size_conditioning_flags(f, g.size_conditioning);
  g.controlnets = controlnet_units(f);
  g.guess_mode = f.guess_mode;
  if (!f.mask.empty()) {
    g.inpaint.mask = pipeline::image_to_tensor(read_png(f.mask));
    g.inpaint.blur = f.mask_blur;
    g.inpaint.invert = f.invert_mask;
    g.inpaint.crop_padding = f.mask_crop;
    g.inpaint.fill = f.inpaint_fill;
    pipeline::validate_inpaint_fill(g.inpaint.fill);
  } else if (f.mask_blur > 0 || f.invert_mask || f.mask_crop >= 0 || f.inpaint_fill != "original") {
    throw InvalidArgument(
        "--mask-blur/--invert-mask/--mask-crop/--inpaint-fill adjust a --mask: give one");
  }
  // --devices (CFG-parallel): checked before anything loads, by the launcher and each worker.
  // HiDream and FLUX (the DiT families) run through run_hidream's flags.
  const bool flux = pipeline::is_flux_folder(f.model);
  const bool qwen = pipeline::is_qwenimage_folder(f.model);
  const bool hidream = flux || qwen || pipeline::is_hidream_folder(f.model);
  if (hidream) {
    const char* family = flux ? "FLUX" : qwen ? "Qwen-Image" : "HiDream";
    if (img2img && !flux)
      throw InvalidArgument("'" + f.model + "' is a " + family +
                            " model: it runs txt2img and instruction edits (diffuse edit), not "
                            "img2img");
    check_hidream_generate_flags(f, family);
    DitCliFlags h;
    h.model = f.model;
    if (!f.transformer.empty()) h.transformer = f.transformer;
    h.prompt = f.prompts[0];
    if (!f.negative_prompts.empty()) h.negative_prompt = f.negative_prompts[0];
    if (f.width > 0) h.width = f.width;
    if (f.height > 0) h.height = f.height;
    // Not given: the HiDream variant's defaults, not Stable Diffusion's.
    if (f.steps_given) h.steps = f.steps;
    if (f.cfg_given) h.cfg_scale = f.cfg_scale;
    h.seed = f.seed;
    h.latents_file = f.latents_file;
    h.vae_tiling = f.vae_tiling;
    if (!f.accel.cache.empty()) h.cache = f.accel.cache;
    h.out = f.out;
    h.device = f.load.device;
    h.text_encoder_device = f.load.text_encoder_device;
    h.vae_device = f.load.vae_device;
    h.dtype = f.load.dtype;
    h.attention = f.load.attention;
    // Keeping each network in memory only while it runs is what streaming the transformer's
    // blocks does for HiDream (the text encoders are freed before it loads either way).
    if (f.load.offload) h.stream_weights = "on";
    h.weights = f.load.weights;
    h.max_memory = f.load.max_memory;
    h.scheduler = f.scheduler;
    for (const auto& l : f.load.loras) h.loras.push_back(parse_lora_flag(l));
    h.lora_lenient = f.load.lora_lenient;
    h.quiet = f.quiet;
    h.json = f.json;
    h.true_cfg_scale = f.true_cfg_scale;
    h.area_side = f.area_side;
    h.max_sequence_length = f.max_sequence_length;
    h.parallel = f.parallel;
    if (img2img) {
      h.image = f.init_image;
      h.strength = f.strength;
      h.mask = f.mask;
      h.mask_blur = f.mask_blur;
      h.invert_mask = f.invert_mask;
      h.mask_crop = f.mask_crop;
      if (f.inpaint_fill != "original")
        throw InvalidArgument(
            "--inpaint-fill: FLUX starts the masked region from the source "
            "(original); the other fills are Stable Diffusion's");
      h.width = f.width;  // 0: the image's size
      h.height = f.height;
    }
    return run_hidream(h, /*edit=*/false);
  }
  if (f.parallel.active()) {
    check_sd_parallel_run(f.parallel, g);
    require_shared_seed(f.parallel, g.seed.has_value());
  }
  if (!f.transformer.empty())
    throw InvalidArgument("--transformer: only for HiDream and FLUX model folders, and '" +
                          f.model + "' is neither (a Stable Diffusion UNet file: --unet FILE)");
  if (f.true_cfg_scale || f.max_sequence_length)
    throw InvalidArgument("--true-cfg-scale/--max-sequence-length: FLUX options; '" + f.model +
                          "' is not a FLUX folder");
  if (f.area_side)
    throw InvalidArgument("--area-side: HiDream's; '" + f.model + "' is not a HiDream folder");
  if (!f.scheduler.empty()) {
    auto names = scheduler_names();
    if (std::find(names.begin(), names.end(), f.scheduler) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      throw InvalidArgument("unknown scheduler '" + f.scheduler + "' (expected one of: " + list +
                            ")");
    }
  }
  // Check everything that does not need the model before the (slow) load.
  if (!fs::exists(f.model)) throw IoError("model '" + f.model + "' does not exist");
  pipeline::validate_generation_config(g, img2img,
                                       pipeline::vae_scale_factor_of(f.model, f.load.config_dir));
  accel::refuse_dit_cache_on_unet(g.dit_cache);
  LoadOptions lo = to_load_options(f.load);
  // One generation, then the process exits: no network needs to outlive its stage.
  lo.single_generation = f.batch_count == 1;
  // A1111's <lora:NAME:SCALE> tags: out of the prompts, into the load options (one load, one
  // merge for every image of the run).
  if (f.prompt_syntax == "a1111")
    for (auto& spec : pipeline::take_prompt_loras(g, f.lora_dir)) lo.loras.push_back(spec);
  {
    // The output is checked before the (slow) load: PNG only (latents for the next expert:
    // safetensors), and never a path whose final rename would destroy a directory, device,
    // FIFO or socket.
    std::string ext = fs::path(f.out).extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    const bool latents_out = g.denoising_end < 1;
    if (latents_out && ext != ".safetensors")
      throw InvalidArgument("-o/--out '" + f.out + "': --denoising-end " +
                            c10::str(g.denoising_end) +
                            " stops before decoding: name a .safetensors file for the latents");
    if (!latents_out && !f.out.empty() && ext != ".png")
      throw InvalidArgument("-o/--out '" + f.out +
                            "': only PNG output is supported (use a .png name)");
    // One file per image, or with --denoising-end one latents file per run of the batch count.
    const size_t total =
        (latents_out ? 1 : g.prompts.size() * static_cast<size_t>(g.images_per_prompt)) *
        static_cast<size_t>(std::max(f.batch_count, 1));
    for (size_t i = 0; i < std::max<size_t>(total, 1); ++i)
      io::check_output_path(output_path(f.out, i, total), "output");
  }
  Image init;
  if (img2img && g.denoising_start > 0) {
    if (!f.init_image.empty())
      throw InvalidArgument(
          "-i/--init-image: --denoising-start continues from --latents; give "
          "one or the other");
    if (f.latents_file.empty())
      throw InvalidArgument("--denoising-start " + c10::str(g.denoising_start) +
                            " continues another run: --latents FILE (txt2img --denoising-end "
                            "... -o FILE.safetensors writes it)");
  } else if (img2img) {
    if (f.init_image.empty()) throw InvalidArgument("-i/--init-image: an input PNG is required");
    init = read_png(f.init_image);
  }
  if (!f.latents_file.empty()) g.latents = read_tensor_file(f.latents_file, "latents");
  if (!f.noise_file.empty()) g.noise = read_tensor_file(f.noise_file, "noise");

  if (f.parallel.is_launcher()) return run_parallel_launcher(f.parallel, g.seed.has_value());
  if (f.parallel.is_worker()) lo.device = f.parallel.rank_device;
  Progress progress(f.quiet || f.json);
  if (!f.quiet && !f.json) std::cerr << "loading " << f.model << " ...\n";
  std::shared_ptr<Text2Image> t2i;
  std::shared_ptr<Image2Image> i2i;
  const PipelineInfo* info;
  if (img2img) {
    i2i = std::make_shared<Image2Image>(Image2Image::load(f.model, lo));
    info = &i2i->info();
  } else {
    t2i = std::make_shared<Text2Image>(Text2Image::load(f.model, lo));
    info = &t2i->info();
  }
  if (f.parallel.is_worker())
    (img2img ? i2i->impl() : t2i->impl())
        ->set_cfg_group(join_group(f.parallel, "CFG-parallel", parallel_job(f, g, img2img)));
  if (!f.quiet && !f.json)
    std::cerr << "device " << info->device
              << (info->text_encoder_device != info->device
                      ? " (text encoder " + info->text_encoder_device + ")"
                      : "")
              << (info->vae_device != info->device ? " (vae " + info->vae_device + ")" : "")
              << ", unet " << info->unet_dtype << ", vae " << info->vae_dtype << ", attention "
              << info->attention
              << (info->offload ? lo.offload ? ", offload" : ", networks loaded per stage" : "")
              << ", scheduler "
              << (g.scheduler.empty() ? info->scheduler : g.scheduler)
              // Networks loaded per stage load in their stages' times, not here.
              << (info->offload ? " (opened in " : " (loaded in ") << format_seconds(info->load_s)
              << ")\n";
  if (!f.quiet && !f.json)
    for (const auto& l : info->loras) std::cerr << "lora " << l << "\n";

  std::vector<GenerationResult> results;
  uint64_t base_seed = g.seed.value_or(0);
  for (int b = 0; b < f.batch_count; ++b) {
    GenerationConfig run = g;
    if (g.seed)
      run.seed = base_seed + static_cast<uint64_t>(b);
    else if (b > 0)
      run.seed = results[0].seed + static_cast<uint64_t>(b);
    StepCallback cb = [&progress](const StepEvent& e) { return progress(e); };
    if (f.parallel.is_worker()) cb = worker_step_callback(f.parallel, cb);
    results.push_back(img2img ? i2i->generate(run, init, cb) : t2i->generate(run, cb));
    progress.finish();
    if (b == 0)
      for (const auto& w : results.back().warnings) std::cerr << "warning: " << w << "\n";
  }

  if (f.parallel.worker_rank > 0) return 0;  // rank 0 decodes and writes
  if (g.denoising_end < 1) {
    // Latents for the next expert, one file per run of the batch count.
    for (size_t b = 0; b < results.size(); ++b) {
      const std::string path = output_path(f.out, b, results.size());
      io::save_safetensors(path, {{"latents", results[b].latents}},
                           {{"denoising_end", c10::str(g.denoising_end)},
                            {"seed", std::to_string(results[b].seed)},
                            {"steps", std::to_string(g.steps)}});
      if (!f.json) std::cout << path << "\n";
    }
    return 0;
  }
  size_t total = 0;
  for (const auto& r : results) total += r.images.size();
  nlohmann::json files = nlohmann::json::array();
  size_t index = 0;
  for (const auto& r : results) {
    for (size_t i = 0; i < r.images.size(); ++i, ++index) {
      size_t prompt_index = i / static_cast<size_t>(g.images_per_prompt);
      std::string neg = g.negative_prompts.empty()       ? ""
                        : g.negative_prompts.size() == 1 ? g.negative_prompts[0]
                                                         : g.negative_prompts[prompt_index];
      std::string path = output_path(f.out, index, total);
      pipeline::ImageParameters params;
      params.prompt = g.prompts[prompt_index];
      params.negative_prompt = neg;
      params.steps = g.steps;
      params.scheduler = g.scheduler.empty() ? info->scheduler : g.scheduler;
      params.cfg_scale = g.guidance_scale;
      params.seed = r.seed;
      params.width = r.images[i].width;
      params.height = r.images[i].height;
      params.model = f.model;
      if (img2img) params.strength = g.strength;
      params.device = info->device;
      params.dtype = info->unet_dtype;
      write_png(path, r.images[i], params.png_chunks());
      files.push_back(path);
      if (!f.json) std::cout << path << "\n";
    }
  }
  RunSummary summary;
  for (const auto& file : files) summary.files.push_back(file.get<std::string>());
  summary.seed = results[0].seed;
  summary.device = info->device;
  summary.dtype = info->unet_dtype;
  summary.vae_dtype = info->vae_dtype;
  summary.attention = info->attention;
  summary.scheduler = g.scheduler.empty() ? info->scheduler : g.scheduler;
  summary.load_s = info->load_s;
  summary.weight_bytes = info->weight_bytes;
  summary.loras = info->loras;
  for (const auto& r : results) summary.runs.push_back(r.timings);
  if (f.json)
    std::cout << summary.json().dump(2) << "\n";
  else if (!f.quiet)
    summary.print(img2img);
  return 0;
}

}  // namespace

Command add_txt2img_command(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  add_common_flags(app, *f, false);
  const CLI::Option* steps = app.get_option("--steps");
  const CLI::Option* cfg = app.get_option("--cfg-scale");
  const CLI::Option* syntax = app.get_option("--prompt-syntax");
  return [f, steps, cfg, syntax]() {
    f->steps_given = steps->count() > 0;
    f->cfg_given = cfg->count() > 0;
    f->prompt_syntax_given = syntax->count() > 0;
    return run_command(*f, false);
  };
}

Command add_img2img_command(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  add_common_flags(app, *f, true);
  const CLI::Option* syntax = app.get_option("--prompt-syntax");
  return [f, syntax]() {
    f->prompt_syntax_given = syntax->count() > 0;
    return run_command(*f, true);
  };
}

}  // namespace diffuse::app
