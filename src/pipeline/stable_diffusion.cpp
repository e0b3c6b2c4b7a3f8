#include "pipeline/stable_diffusion.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <set>

#include "accel/dit_cache.h"
#include "accel/token_merging_payoff.h"
#include "accel/unet_accelerator.h"
#include "device/cpu_allocator.h"
#include "device/cpu_load.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "device/memory.h"
#include "io/ldm_checkpoint.h"
#include "io/model_folder.h"
#include "io/pillow_resample.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/controlnet.h"
#include "models/load_component.h"
#include "models/unet2d_condition.h"
#include "nn/attention.h"
#include "nn/attention_npu.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/load_weights.h"
#include "parallel/branch_split.h"
#include "parallel/replicated.h"
#include "pipeline/control_image.h"
#include "pipeline/controlnet_step.h"
#include "pipeline/denoise_extras.h"
#include "pipeline/denoised_estimate.h"
#include "pipeline/denoising_range.h"
#include "pipeline/finite_check.h"
#include "pipeline/inpaint_mask.h"
#include "pipeline/lora_set.h"
#include "pipeline/memory_plan_folder.h"
#include "pipeline/memory_report.h"
#include "pipeline/model_source.h"
#include "pipeline/sd_components.h"
#include "pipeline/sdxl_conditioning.h"
#include "pipeline/step_work.h"
#include "pipeline/vae_tiling_policy.h"
#include "quant/quantized_weight.h"
#include "schedulers/scheduler.h"
#include "text/clip_tokenizer.h"
#include "text/prompt_weighting.h"

namespace diffuse::pipeline {
namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) & ((1ull << 53) - 1);
}

// Noise is always drawn on the CPU with PyTorch's generator and then moved, so a seed gives
// the same latents on every device and the same as torch.Generator("cpu").manual_seed(seed).
torch::Tensor cpu_randn(c10::IntArrayRef shape, at::Generator& gen) {
  return torch::randn(shape, gen, torch::TensorOptions().dtype(torch::kFloat32));
}

}  // namespace

torch::Tensor image_to_tensor(const Image& image) {
  return torch::from_blob(const_cast<uint8_t*>(image.rgb.data()), {image.height, image.width, 3},
                          torch::kUInt8)
      .clone();
}

std::vector<Image> to_images(const torch::Tensor& nhwc) {
  // diffusers' numpy_to_pil: (x * 255).round() as uint8.
  auto u8 = (nhwc * 255).round().clamp(0, 255).to(torch::kUInt8).contiguous();
  std::vector<Image> out;
  for (int64_t i = 0; i < u8.size(0); ++i) {
    Image img;
    img.height = static_cast<int>(u8.size(1));
    img.width = static_cast<int>(u8.size(2));
    auto slice = u8[i];
    img.rgb.assign(slice.data_ptr<uint8_t>(), slice.data_ptr<uint8_t>() + slice.numel());
    out.push_back(std::move(img));
  }
  return out;
}

void validate_generation_config(const GenerationConfig& c, bool image2image, int size_multiple) {
  if (c.prompts.empty()) throw InvalidArgument("no prompt given (prompts is empty)");
  if (!c.negative_prompts.empty() && c.negative_prompts.size() != 1 &&
      c.negative_prompts.size() != c.prompts.size())
    throw InvalidArgument("negative prompts: got " + std::to_string(c.negative_prompts.size()) +
                          ", expected none, one, or one per prompt (" +
                          std::to_string(c.prompts.size()) + ")");
  if (c.steps < 1) throw InvalidArgument("steps must be >= 1, got " + std::to_string(c.steps));
  if (c.images_per_prompt < 1)
    throw InvalidArgument("images per prompt must be >= 1, got " +
                          std::to_string(c.images_per_prompt));
  const int m = std::max(1, size_multiple);
  if (c.width < 0 || c.height < 0 || c.width % m != 0 || c.height % m != 0)
    throw InvalidArgument("width and height must be positive multiples of " + std::to_string(m) +
                          " (the VAE's scale factor), got " + std::to_string(c.width) + "x" +
                          std::to_string(c.height));
  if (c.width > 8192 || c.height > 8192)
    throw InvalidArgument("width/height above 8192 are not supported, got " +
                          std::to_string(c.width) + "x" + std::to_string(c.height));
  if (!(c.guidance_scale >= 0 && std::isfinite(c.guidance_scale)))
    throw InvalidArgument("guidance scale must be a finite number >= 0, got " +
                          std::to_string(c.guidance_scale));
  if (c.prompt_syntax != "plain" && c.prompt_syntax != "a1111")
    throw InvalidArgument("prompt syntax must be plain or a1111, got '" + c.prompt_syntax + "'");
  if (image2image && !(c.strength > 0 && c.strength <= 1))
    throw InvalidArgument("strength must be in (0, 1], got " + std::to_string(c.strength));
  if (!(c.denoising_end > 0 && c.denoising_end <= 1))
    throw InvalidArgument("denoising_end must be in (0, 1], got " +
                          std::to_string(c.denoising_end));
  if (!(c.denoising_start >= 0 && c.denoising_start < 1))
    throw InvalidArgument("denoising_start must be in [0, 1), got " +
                          std::to_string(c.denoising_start));
  if (c.denoising_start >= c.denoising_end)
    throw InvalidArgument("denoising_start (" + std::to_string(c.denoising_start) +
                          ") must be below denoising_end (" + std::to_string(c.denoising_end) +
                          "): nothing of the schedule would run");
  if (!image2image && c.denoising_start > 0)
    throw InvalidArgument(
        "denoising_start continues another run from its latents: image-to-image takes them "
        "(img2img --denoising-start with --latents)");

  accel::validate_accel_config(c);
  validate_vae_tiling_options(c.vae_tiling);
  validate_size_conditioning(c.size_conditioning);
}

StableDiffusion::StableDiffusion(const std::string& path, const LoadOptions& options)
    : c_(std::make_unique<Components>()) {
  double t0 = now_s();
  device::configure_cpu_threads();
  device::set_cpu_memory_policy();
  c_->device = device::resolve_device(options.device);
  // Per-component placement: empty = the UNet's device (not "auto" again, which could differ
  // from an explicit --device).
  c_->text_device = options.text_encoder_device.empty()
                        ? c_->device
                        : device::resolve_device(options.text_encoder_device);
  c_->vae_device =
      options.vae_device.empty() ? c_->device : device::resolve_device(options.vae_device);
  for (const auto& d : {c_->device, c_->text_device, c_->vae_device}) device::prepare_device(d);
  c_->unet_dtype = device::resolve_dtype(options.dtype, c_->device, "unet");
  c_->text_dtype = device::resolve_dtype(options.dtype, c_->text_device, "text_encoder");
  c_->vae_dtype = device::resolve_dtype(options.vae_dtype, c_->vae_device, "vae");
  nn::register_npu_attention_backend();
  nn::set_default_attention_backend(
      nn::attention_backend_from_flag_or_env(options.attention, c_->device));

  ModelSourceOptions so;
  so.config_dir = options.config_dir;
  so.v_prediction = options.v_prediction;
  so.unet_file = options.unet_file;
  c_->source = open_model_source(path, so);
  auto& src = c_->source;
  // A single file carries no config: its configs were inferred from the weights' shapes, and
  // when one does not work the fix is the model's own config folder.
  try {
    for (const auto& t : src.text_encoders) {
      Components::TextEncoder e;
      e.component = t.component;
      e.tokenizer =
          std::make_unique<text::ClipTokenizer>(text::ClipTokenizer::from_folder(t.tokenizer_dir));
      e.config = models::ClipTextConfig::from_json(t.config);
      e.config.with_projection = t.with_projection;
      c_->text_encoders.push_back(std::move(e));
    }
    c_->unet_config = models::UNet2DConditionConfig::from_json(src.unet_config);
    c_->vae_config = models::AutoencoderKLConfig::from_json(src.vae_config);
  } catch (const ConfigError& e) {
    if (src.kind != "single-file" || !options.config_dir.empty()) throw;
    throw ConfigError(std::string(e.what()) +
                      " (the configs were inferred from the checkpoint's weights; pass the "
                      "model's diffusers folder with --config DIR)");
  }
  c_->sdxl = c_->unet_config.text_time;
  if (c_->sdxl) {
    c_->sdxl_options = SdxlOptions::from_model_index(src.model_index);
    const auto& last = c_->text_encoders.back().config;
    if (!last.with_projection)
      throw ConfigError(path +
                        ": the UNet takes SDXL's pooled text embedding (addition_embed_type "
                        "text_time), but the folder has no text_encoder_2 "
                        "(CLIPTextModelWithProjection) to make it");
    check_sdxl_unet(c_->unet_config, c_->sdxl_options, last.projection_dim,
                    src.unet_config.source());
  }
  check_text_encoders(src);
  c_->scheduler_config = src.scheduler_config;
  // Built once now so that a bad scheduler config fails at load, naming its key, not at the
  // first generation.
  schedulers::make_scheduler(c_->scheduler_config);
  c_->offload = options.offload || options.single_generation;
  c_->max_memory = options.max_memory;
  c_->keep_16bit_weights = options.keep_16bit_weights;
  // Offload's point is the lowest peak; a single generation keeps the UNet for all its steps,
  // where packing pays.
  c_->pack_conv_weights = options.pack_conv_weights && !options.offload;
  if (options.lora_mode != "merged" && options.lora_mode != "unmerged")
    throw InvalidArgument("lora_mode: expected \"merged\" or \"unmerged\", got \"" +
                          options.lora_mode + "\"");
  c_->weight_type = quant::parse_weight_type(options.weights, "weights");
  // Quantized layers have no plain weight to merge into: their adapters run unmerged.
  const bool gguf_unet = src.unet_file && io::is_gguf_file(src.unet_file->path);
  c_->set_lora_networks();
  c_->loras.set_unmerged(options.lora_mode == "unmerged" || c_->weight_type || gguf_unet);
  c_->load_loras = options.loras;
  c_->lora_lenient = options.lora_lenient;
  if (!options.loras.empty()) apply_loras({});  // a bad adapter fails the load, not a run
  for (const auto& [name, w] : src.unet_weights) c_->unet_parameters += w.numel();
  if (src.unet_file) c_->unet_parameters = src.unet_file->parameters;
  c_->plan_networks = plan_request(src, plan_options());
  if (!c_->offload) {
    for (size_t k = 0; k < c_->text_encoders.size(); ++k)
      info_.weight_bytes += nn::resident_parameter_bytes(*c_->text_encoder(k));
    c_->unet();
    c_->vae();
    info_.weight_bytes += nn::resident_parameter_bytes(*c_->unet_module) +
                          nn::resident_parameter_bytes(*c_->vae_module);
    c_->resident_on_device = nn::resident_parameter_bytes(*c_->unet_module);
    if (c_->vae_device == c_->device)
      c_->resident_on_device += nn::resident_parameter_bytes(*c_->vae_module);
    if (c_->text_device == c_->device)
      for (auto& t : c_->text_encoders)
        c_->resident_on_device += nn::resident_parameter_bytes(*t.module);
    // Weights now live in the modules; drop the file mappings.
    src.unet_weights.clear();
    src.vae_weights.clear();
    for (auto& t : src.text_encoders) t.weights.clear();
    // And the loading's freed temporaries (dtype conversions, on the host whatever the device):
    // the CPU heap keeps freed memory for the next block's activations, which would leave
    // ~0.5 GiB of it beside the resident networks through the first stages.
    device::empty_cache(torch::kCPU);
  }

  info_.model = path;
  info_.device = device::device_name(c_->device);
  info_.text_encoder_device = device::device_name(c_->text_device);
  info_.vae_device = device::device_name(c_->vae_device);
  info_.unet_dtype = device::dtype_name(c_->unet_dtype);
  // A GGUF UNet's own block types, unless --weights quantizes the rest too.
  info_.weights = gguf_unet && options.weights == "none" ? "gguf" : options.weights;
  info_.text_encoder_dtype = device::dtype_name(c_->text_dtype);
  info_.vae_dtype = device::dtype_name(c_->vae_dtype);
  info_.offload = c_->offload;
  info_.attention = nn::attention_backend_name(nn::default_attention_backend());
  info_.scheduler = c_->scheduler_config.get<std::string>("_class_name", "PNDMScheduler");
  info_.prediction_type = c_->scheduler_config.get<std::string>("prediction_type", "epsilon");
  // sample_size is the latent size the model was trained at: [s] or [h, w]; 64 if absent.
  const auto& ss = c_->unet_config.sample_size;
  int64_t sh = ss.empty() ? 64 : ss[0], sw = ss.empty() ? 64 : ss.back();
  info_.default_width = static_cast<int>(sw * vae_scale_factor());
  info_.default_height = static_cast<int>(sh * vae_scale_factor());
  info_.load_s = now_s() - t0;
}

StableDiffusion::~StableDiffusion() = default;

void StableDiffusion::check_text_encoders(const ModelSource& src) const {
  int64_t width = 0;
  for (size_t k = 0; k < c_->text_encoders.size(); ++k) {
    const auto& t = c_->text_encoders[k];
    if (auto [token, id] = t.tokenizer->largest_id_token(); id >= t.config.vocab_size)
      throw ConfigError("tokenizer '" + src.text_encoders[k].tokenizer_dir + "': token '" + token +
                        "' has id " + std::to_string(id) + ", outside the text encoder's " +
                        "vocabulary [0, " + std::to_string(t.config.vocab_size) + ") (" +
                        src.text_encoders[k].config.source() +
                        " vocab_size): the tokenizer and the text encoder do not match");
    width += t.config.hidden_size;
  }
  // The UNet attends to the encoders' states side by side (SDXL: CLIP-L's 768 + CLIP-G's 1280).
  const auto& cross = c_->unet_config.cross_attention_dim;
  if (!cross.empty() && cross.front() != width) {
    std::string widths;
    for (const auto& t : c_->text_encoders)
      widths +=
          (widths.empty() ? "" : " + ") + t.component + " " + std::to_string(t.config.hidden_size);
    throw ConfigError(src.unet_config.source() + ": cross_attention_dim is " +
                      std::to_string(cross.front()) + ", but the text encoders give " + widths +
                      " = " + std::to_string(width) +
                      ": the UNet and the text encoders do not match");
  }
}

std::vector<std::pair<std::string, torch::nn::Module*>> StableDiffusion::loaded_networks() const {
  std::vector<std::pair<std::string, torch::nn::Module*>> out;
  for (auto& t : c_->text_encoders)
    if (!t.module.is_empty()) out.emplace_back(t.component, t.module.get());
  if (!c_->unet_module.is_empty()) out.emplace_back("unet", c_->unet_module.get());
  if (!c_->vae_module.is_empty()) out.emplace_back("vae", c_->vae_module.get());
  return out;
}

double StableDiffusion::apply_loras(const std::vector<LoraSpec>& for_this_run) {
  std::vector<LoraSpec> wanted = c_->load_loras;
  wanted.insert(wanted.end(), for_this_run.begin(), for_this_run.end());
  if (wanted.empty() && c_->loras.empty()) return 0;
  const bool reading = c_->loras.needs_reading(wanted);
  // New files are checked against every network.
  const double seconds =
      c_->loras.set(wanted, c_->lora_lenient, c_->lora_modules(/*load=*/reading));
  info_.loras = c_->loras.report();
  if (reading && c_->offload) {  // each stage loads (and patches) its network again
    c_->done_with_text_encoders();
    c_->done_with(c_->unet_module, c_->device);
  }
  return seconds;
}

std::unique_ptr<schedulers::Scheduler> StableDiffusion::make_scheduler(
    const GenerationConfig& config) const {
  auto scheduler = config.scheduler.empty()
                       ? schedulers::make_scheduler(c_->scheduler_config)
                       : schedulers::make_scheduler(config.scheduler, c_->scheduler_config);
  scheduler->set_timesteps(config.steps);
  scheduler->set_eta(config.eta);
  return scheduler;
}

PromptEmbeddings StableDiffusion::encode_for_run(const GenerationConfig& config, uint64_t seed,
                                                 double t0, StageTimings* timings) {
  seed_devices(seed);
  device::reset_peak_memory(c_->text_device);
  auto embeds = encode_prompt(config.prompts, config.negative_prompts, config.images_per_prompt,
                              /*guidance=*/config.guidance_scale > 1.0, config.prompt_syntax);
  check_stage_finite(embeds.positive, "text encoder", c_->text_device, c_->text_dtype);
  check_stage_finite(embeds.negative, "text encoder", c_->text_device, c_->text_dtype);
  check_stage_finite(embeds.pooled, "text encoder", c_->text_device, c_->text_dtype);
  check_stage_finite(embeds.negative_pooled, "text encoder", c_->text_device, c_->text_dtype);
  c_->done_with_text_encoders();
  timings->text_encode_s = now_s() - t0;
  record_stage_memory(timings, "text_encode", c_->text_device);
  return embeds;
}

FolderPlanOptions StableDiffusion::plan_options() const {
  FolderPlanOptions o;
  o.device = c_->device;
  o.text_device = c_->text_device;
  o.vae_device = c_->vae_device;
  o.dtype = c_->unet_dtype;
  o.text_dtype = c_->text_dtype;
  o.vae_dtype = c_->vae_dtype;
  o.weight_type = c_->weight_type ? quant::weight_type_name(*c_->weight_type) : "";
  o.streaming = "off";                  // the UNet loads whole
  o.keep_text_encoders = !c_->offload;  // every network resident (a batch, the server)
  o.max_memory = c_->max_memory;
  return o;
}

void StableDiffusion::plan_memory_for(const GenerationConfig& config, int width, int height,
                                      StageTimings* timings) const {
  auto o = plan_options();
  o.width = width;
  o.height = height;
  o.images = static_cast<int64_t>(config.prompts.size()) * config.images_per_prompt;
  o.vae_tiling = config.vae_tiling.mode;
  auto request = c_->plan_networks;
  set_plan_stages(request, "stable-diffusion", c_->source.unet_config, c_->source.vae_config, o);
  // What is loaded already is part of the plan, not taken from the device's free memory.
  int64_t resident = c_->resident_on_device;
  // The generation's ControlNets, loaded before the text encoders and kept.
  std::set<std::string> nets;
  if (!config.controlnets.empty()) validate_controlnet_units(config.controlnets);
  for (const auto& u : config.controlnets) {
    if (!nets.insert(u.model).second) continue;
    NetworkWeights n;
    n.component = u.model;
    n.label = "ControlNet";
    const auto it = c_->controlnets.find(u.model);
    if (it != c_->controlnets.end()) {
      n.bytes = nn::resident_parameter_bytes(*it->second);
      resident += n.bytes;
    } else {
      n.bytes = loaded_bytes(io::load_weights_file(models::controlnet_weights_path(u.model)),
                             c_->unet_dtype);
    }
    request.held.push_back(n);
  }
  if (!request.budget_given && request.budget > 0) request.budget += resident;
  const auto plan = plan_memory(request);
  if (!plan.fits) throw InvalidArgument(plan.advice);
  if (timings) timings->plan = plan.line;
}

VaeTilingChoice StableDiffusion::vae_tiling_for(const GenerationConfig& config, int64_t images,
                                                int64_t height, int64_t width) const {
  return choose_vae_tiling(config.vae_tiling, c_->vae_config, images, height, width, c_->vae_device,
                           c_->vae_dtype);
}

void StableDiffusion::seed_devices(uint64_t seed) const {
  // The pipeline's own noise comes from the CPU generator; device generators are seeded so
  // that operators sampling on the device are reproducible as well.
  for (const auto& d : {c_->device, c_->text_device, c_->vae_device})
    device::seed_device_generator(d, seed);
}

torch::Tensor StableDiffusion::draw_noise(c10::IntArrayRef shape, at::Generator& gen) const {
  if (!noise_) return cpu_randn(shape, gen);
  auto t = noise_(shape);
  if (!t.defined() || t.sizes() != shape)
    throw InvalidArgument("noise source returned a tensor of the wrong shape (expected " +
                          c10::str(shape) + ")");
  return t.to(torch::kFloat32);
}

void StableDiffusion::set_scheduler_config(const nlohmann::json& config) {
  c_->scheduler_config = io::JsonConfig(config, "scheduler config");
  info_.scheduler = c_->scheduler_config.get<std::string>("_class_name", info_.scheduler);
  info_.prediction_type = c_->scheduler_config.get<std::string>("prediction_type", "epsilon");
}

int StableDiffusion::vae_scale_factor() const {
  return static_cast<int>(c_->vae_config.spatial_factor());
}

int64_t StableDiffusion::latent_channels() const {
  // The UNet's output: an inpainting UNet takes more input channels (mask, masked image).
  return c_->unet_config.out_channels;
}

torch::Tensor StableDiffusion::decode_latents(const torch::Tensor& latents,
                                              const std::optional<models::VaeTiling>& tiling) {
  const auto& vc = c_->vae_config;
  auto z = vc.from_latents(latents.to(c_->vae_device, torch::kFloat32));
  auto img = vae_decode(*c_->vae(), z.to(c_->vae_dtype), tiling).to(torch::kFloat32);
  c_->done_with(c_->vae_module, c_->vae_device);
  return (img / 2 + 0.5).clamp(0, 1).permute({0, 2, 3, 1}).contiguous().to(torch::kCPU);
}

GenerationResult StableDiffusion::denoise_and_decode(
    const GenerationConfig& config, const PromptEmbeddings& embeds, torch::Tensor latents,
    const torch::Tensor& timesteps, schedulers::Scheduler& scheduler, at::Generator& gen,
    const StepCallback& on_step, StageTimings timings, uint64_t seed, const DenoiseExtras* extras) {
  double start = now_s();
  const InpaintLatents* inpaint = extras && extras->inpaint ? &*extras->inpaint : nullptr;
  const ControlNetSteps* controlnets =
      extras && extras->controlnets && !extras->controlnets->empty() ? extras->controlnets
                                                                     : nullptr;
  device::reset_peak_memory(c_->device);
  bool guidance = embeds.negative.defined();
  auto cond = guidance ? torch::cat({embeds.negative, embeds.positive}) : embeds.positive;
  cond = cond.to(c_->device, c_->unet_dtype);
  trace("prompt_embeds_cfg", cond);
  // SDXL: the pooled text embedding and the time ids of each branch, in the same order.
  std::optional<models::UNetAddedConditions> added;
  if (c_->sdxl) {
    const int64_t f = vae_scale_factor();
    const int height = static_cast<int>(latents.size(2) * f),
              width = static_cast<int>(latents.size(3) * f);
    const auto time_ids = [&](bool negative) {
      const auto ids =
          sdxl_time_ids(config.size_conditioning, c_->sdxl_options, height, width, negative);
      return torch::tensor(ids, torch::kFloat64)
          .to(torch::kFloat32)
          .unsqueeze(0)
          .repeat({latents.size(0), 1});
    };
    added.emplace();
    added->text_embeds =
        guidance ? torch::cat({embeds.negative_pooled, embeds.pooled}) : embeds.pooled;
    added->text_embeds = added->text_embeds.to(c_->device, c_->unet_dtype);
    added->time_ids = guidance ? torch::cat({time_ids(true), time_ids(false)}) : time_ids(false);
    added->time_ids = added->time_ids.to(c_->device);
    trace("add_text_embeds_cfg", added->text_embeds);
    trace("add_time_ids_cfg", added->time_ids);
  }
  // CFG-parallel: this rank runs the UNet on its own branch of [negative; positive] only.
  std::optional<parallel::BranchShard> shard;
  if (cfg_group_) {
    if (!guidance)
      throw InvalidArgument("CFG-parallel needs classifier-free guidance (guidance scale > 1)");
    if (controlnets && controlnets->guess_mode())
      throw InvalidArgument(
          "guess mode runs the ControlNets on the conditional branch only: it cannot split the "
          "guidance branches over ranks (CFG-parallel); run it on one device");
    shard.emplace(*cfg_group_, 2);
    cond = shard->local(cond);
    if (added) {
      added->text_embeds = shard->local(added->text_embeds);
      added->time_ids = shard->local(added->time_ids);
    }
  }
  latents = latents.to(c_->device, torch::kFloat32);
  int64_t n = timesteps.size(0);
  GenerationConfig accel_config = config;
  std::vector<std::string> accel_warnings;
  // Token merging under the auto policy runs only where it makes the whole run faster: the
  // merged sites must save more than the margin of whole UNet calls (they are a small share of
  // one). The first run at a shape times its first call plain to know; it merges from there
  // (repeating that call merged, so that the image is exactly the merged one) only if the
  // saving still pays for the thrown-away call.
  accel::TokenMergingPayoff* tome_undecided = nullptr;
  const auto leave_tome_out = [&](const accel::TokenMergingPayoff& payoff) {
    accel_config.token_merging.ratio = 0;
    accel_warnings.push_back(accel::token_merging_skipped_note(payoff, config.token_merging.ratio,
                                                               n, device::device_name(c_->device)));
  };
  if (config.token_merging.ratio > 0 && !config.token_merging.always) {
    int64_t batch = latents.size(0) * (guidance ? 2 : 1);
    if (shard) batch = shard->local(torch::zeros({batch})).size(0);
    auto& payoff =
        token_merging_payoff(config.token_merging, batch, latents.size(2), latents.size(3));
    if (payoff.saved_s() <= 0 || (payoff.call_s > 0 && !payoff.pays(n, false)))
      leave_tome_out(payoff);
    else if (payoff.call_s <= 0)
      tome_undecided = &payoff;
  }
  // Unmerged LoRA updates run as extra products whose tensors and scales the recording holds:
  // a generation with them records afresh (merged ones change the weights it reads in place).
  if (config.cuda_graph && c_->loras.unmerged() && !c_->loras.empty()) c_->unet_graph.reset();
  auto unet_accel = std::make_unique<accel::UNetAccelerator>(accel_config, c_->unet_config, n, seed,
                                                             &c_->unet_graph);
  std::unique_ptr<accel::UNetAccelerator> plain_accel;
  if (tome_undecided) {
    auto plain_config = accel_config;
    plain_config.token_merging.ratio = 0;
    plain_accel = std::make_unique<accel::UNetAccelerator>(plain_config, c_->unet_config, n, seed,
                                                           &c_->unet_graph);
  }
  device::CpuShareMeter cpu_meter(at::get_num_threads());
  bool interrupted = false;
  int steps_run = 0;
  for (int64_t i = 0; i < n; ++i) {
    double step_start = now_s();
    auto t = timesteps[i];
    const auto scaled = scheduler.scale_model_input(latents, t);
    auto model_input = guidance ? torch::cat({scaled, scaled}) : scaled;
    auto unet_input = inpaint ? inpaint->network_input(model_input, guidance) : model_input;
    if (shard) {
      model_input = shard->local(model_input);
      unet_input = shard->local(unet_input);
    }
    const std::string step_name = "step." + std::to_string(i);
    trace(step_name + ".t", t);
    trace(step_name + ".unet_timestep", t);
    trace(step_name + ".unet_input", unet_input);
    std::optional<models::UNetControlResiduals> control;
    if (controlnets) {
      control = controlnets->run(
          i, n, model_input.to(c_->unet_dtype), t, cond, added ? &*added : nullptr, guidance,
          [this](const std::string& name, const torch::Tensor& v) { trace(name, v); });
      if (trace_) {
        for (size_t k = 0; k < control->down.size(); ++k)
          trace(step_name + ".down_block_additional_residual." + std::to_string(k),
                control->down[k]);
        trace(step_name + ".mid_block_additional_residual", control->mid);
      }
    }
    if (unet_accel->deep_cache())
      trace("step." + std::to_string(i) + ".deepcache_full",
            torch::tensor(unet_accel->full_step(i)));
    const auto run_unet = [&](accel::UNetAccelerator& a) {
      return a
          .forward(*c_->unet(), i, unet_input.to(c_->unet_dtype), t, cond,
                   added ? &*added : nullptr, control ? &*control : nullptr)
          .to(torch::kFloat32);
    };
    torch::Tensor noise_pred;
    if (plain_accel) {
      const double call_start = now_s();
      noise_pred = run_unet(*plain_accel);
      noise_pred.flatten()[0].item<float>();  // the device's queued work is done
      double call_s = now_s() - call_start;
      if (cfg_group_) call_s = parallel::sum_over_ranks(*cfg_group_, {call_s})[0];
      tome_undecided->call_s = call_s;
      if (tome_undecided->pays(n, true)) {
        noise_pred = run_unet(*unet_accel);
      } else {
        unet_accel = std::move(plain_accel);
        leave_tome_out(*tome_undecided);
      }
      plain_accel.reset();
    } else {
      noise_pred = run_unet(*unet_accel);
    }
    if (shard) noise_pred = shard->gather(noise_pred);
    trace("step." + std::to_string(i) + ".noise_pred_raw", noise_pred);
    if (guidance) {
      auto chunks = noise_pred.chunk(2);
      noise_pred = chunks[0] + config.guidance_scale * (chunks[1] - chunks[0]);
    }
    schedulers::StepNoise step_noise;
    if (scheduler.is_stochastic()) {
      step_noise =
          noise_
              ? schedulers::StepNoise::from_tensor(draw_noise(latents.sizes(), gen).to(c_->device))
              : schedulers::StepNoise::from_generator(gen);
    }
    latents = scheduler.step(noise_pred, t, latents, step_noise).prev_sample;
    if (inpaint && !inpaint->concat) {
      // An ordinary UNet inpaints by keeping the source's latents, noised to the next step's
      // level, outside the mask.
      trace(step_name + ".scheduler_out", latents);
      auto known = inpaint->image_latents.to(latents.device());
      if (i + 1 < n) {
        const auto next = timesteps[i + 1].reshape({1});
        trace(step_name + ".noise_timestep", next);
        known = scheduler.add_noise(known, inpaint->noise.to(latents.device()),
                                    next.repeat({known.size(0)}));
      }
      trace(step_name + ".init_latents_proper", known);
      latents = inpaint->blend(latents, known);
    }
    if (shard)
      parallel::check_replicated(*cfg_group_, latents,
                                 "latents after step " + std::to_string(i + 1));
    trace("step." + std::to_string(i) + ".latents", latents);
    timings.step_s.push_back(now_s() - step_start);
    steps_run = static_cast<int>(i + 1);
    if (on_step) {
      StepEvent ev;
      ev.step = static_cast<int>(i);
      ev.num_steps = static_cast<int>(n);
      ev.timestep = t.item<double>();
      ev.elapsed_s = now_s() - start;
      ev.latents = &latents;
      const auto denoised = ddpm_denoised(scaled, noise_pred, ev.timestep,
                                          scheduler.alphas_cumprod(), info_.prediction_type);
      ev.denoised = &denoised;
      const StepAction action = on_step(ev);
      const bool last = i + 1 == n;
      // Under CFG-parallel every rank's callback answers alike (the server's ranks agree on
      // each step, server/rank_jobs.h), so all of them stop or finish here together.
      if (action.cancel())
        throw Cancelled("cancelled by the step callback at step " + std::to_string(i + 1) + "/" +
                        std::to_string(n));
      if (action.finish() && !last) {
        latents = denoised;
        interrupted = true;
        break;
      }
    }
  }
  timings.denoise_s = now_s() - start;
  timings.cpu = cpu_meter.share();
  check_stage_finite(latents, "denoising (UNet)", c_->device, c_->unet_dtype);
  record_stage_memory(&timings, "denoise", c_->device);
  c_->done_with(c_->unet_module, c_->device);
  device::empty_cache(c_->device);  // the UNet's freed activations, before the decoder's peak
  trace("latents_out", latents);
  GenerationResult result;
  result.warnings = std::move(accel_warnings);  // every rank's: they decided alike
  // Stopped early for the next expert (denoising_end), or a rank that does not decode.
  if (config.denoising_end < 1 || (shard && cfg_group_->rank() != 0)) {
    result.latents = latents.to(torch::kCPU);
    result.seed = seed;
    result.interrupted = interrupted;
    result.steps_run = steps_run;
    timings.peak_rss_bytes = device::memory_stats().peak_rss_bytes;
    result.timings = std::move(timings);
    return result;
  }
  double d0 = now_s();
  device::reset_peak_memory(c_->vae_device);
  const int64_t f = vae_scale_factor();
  auto tiling = vae_tiling_for(config, latents.size(0), latents.size(2) * f, latents.size(3) * f);
  if (!tiling.warning.empty()) result.warnings.push_back(tiling.warning);
  result.images_float = decode_latents(latents, tiling.tiling);
  check_stage_finite(result.images_float, "VAE decoder", c_->vae_device, c_->vae_dtype);
  timings.vae_decode_s = now_s() - d0;
  record_stage_memory(&timings, "vae_decode", c_->vae_device);
  trace("image", result.images_float);
  result.images = to_images(result.images_float);
  result.latents = latents.to(torch::kCPU);
  // The decoder's freed activations: a resident model's next generation would otherwise start
  // from a CPU heap holding them in pieces its UNet activations do not fit (SD2.1-base at
  // 512x512, two images: 3.50 GiB peak, against 3.0 GiB for the first image). A device's
  // caching allocator keeps its blocks for the next image.
  if (c_->vae_device.is_cpu()) device::empty_cache(c_->vae_device);
  result.seed = seed;
  result.interrupted = interrupted;
  result.steps_run = steps_run;
  if (interrupted) result.warnings.push_back(interrupted_warning(steps_run, n));
  timings.peak_rss_bytes = device::memory_stats().peak_rss_bytes;
  result.timings = std::move(timings);
  return result;
}

accel::TokenMergingPayoff& StableDiffusion::token_merging_payoff(const TokenMergingOptions& tome,
                                                                 int64_t batch,
                                                                 int64_t latent_height,
                                                                 int64_t latent_width) {
  const auto sites = accel::token_merging_sites(tome, c_->unet_config);
  std::string key = std::to_string(batch) + ":" + std::to_string(latent_height) + "x" +
                    std::to_string(latent_width) + ":" + std::to_string(tome.ratio);
  for (const auto& site : sites) key += ":" + site;
  auto it = c_->tome_payoffs.find(key);
  if (it != c_->tome_payoffs.end()) return it->second;
  auto payoff = accel::measure_token_merging(
      *c_->unet(), c_->unet_config, sites, batch, latent_height, latent_width, tome.ratio,
      torch::TensorOptions(c_->unet_dtype).device(c_->device));
  if (cfg_group_) {
    // Every rank must decide alike (their images are compared step by step): the sum of
    // their times decides.
    const auto sums = parallel::sum_over_ranks(*cfg_group_, {payoff.plain_s, payoff.merged_s});
    payoff.plain_s = sums[0];
    payoff.merged_s = sums[1];
  }
  return c_->tome_payoffs.emplace(key, payoff).first->second;
}

int StableDiffusion::cpu_threads_for(const GenerationConfig& config, int64_t images, int width,
                                     int height) const {
  if (!c_->device.is_cpu()) return at::get_num_threads();
  const int64_t rows = images * (config.guidance_scale > 1.0 ? 2 : 1);
  const int64_t f = vae_scale_factor();
  return device::threads_for_step_work(
      unet_step_flops(c_->unet_config, c_->unet_parameters, rows, height / f, width / f));
}

GenerationResult StableDiffusion::text2image(const GenerationConfig& config,
                                             const StepCallback& on_step) {
  validate_generation_config(config, false, vae_scale_factor());
  accel::refuse_dit_cache_on_unet(config.dit_cache);
  accel::validate_accel_config(config, c_->unet_config);
  StageTimings timings;
  int width = config.width ? config.width : info_.default_width;
  int height = config.height ? config.height : info_.default_height;
  plan_memory_for(config, width, height, &timings);
  torch::InferenceMode guard;
  double t0 = now_s();
  int64_t n = static_cast<int64_t>(config.prompts.size()) * config.images_per_prompt;
  device::ScopedCpuThreads cpu_threads(cpu_threads_for(config, n, width, height));
  timings.lora_s = apply_loras(config.loras);
  uint64_t seed = config.seed.value_or(random_seed());
  // Loaded and checked against the UNet before the text encoders run.
  const auto controlnets = controlnet_steps(config, height, width);
  auto embeds = encode_for_run(config, seed, t0, &timings);

  auto scheduler = make_scheduler(config);
  std::vector<int64_t> shape{n, latent_channels(), height / vae_scale_factor(),
                             width / vae_scale_factor()};
  torch::Tensor latents;
  if (config.latents.defined()) {
    check_input_tensor(config.latents, "given latents");
    if (config.latents.sizes() != c10::IntArrayRef(shape))
      throw InvalidArgument("given latents have shape " + c10::str(config.latents.sizes()) +
                            ", expected " + c10::str(c10::IntArrayRef(shape)) +
                            " for this batch and size");
    latents = config.latents.to(torch::kFloat32);
  }
  auto gen = at::detail::createCPUGenerator(seed);
  if (!latents.defined()) latents = cpu_randn(shape, gen);
  trace("initial_latents", latents);
  latents = latents * scheduler->init_noise_sigma();
  trace("init_latents", latents);
  const auto all = scheduler->timesteps();
  const auto range = denoising_range(all, scheduler->num_train_timesteps(), scheduler->order(), 0,
                                     config.denoising_end);
  if (range.end <= range.begin)
    throw InvalidArgument("denoising_end " + std::to_string(config.denoising_end) + " with " +
                          std::to_string(config.steps) +
                          " steps leaves no denoising step; raise it or the steps");
  DenoiseExtras extras;
  extras.controlnets = controlnets.get();
  auto result = denoise_and_decode(config, embeds, latents, all.slice(0, 0, range.end), *scheduler,
                                   gen, on_step, timings, seed, &extras);
  result.timings.total_s = now_s() - t0;
  result.warnings.insert(result.warnings.begin(), embeds.warnings.begin(), embeds.warnings.end());
  return result;
}

GenerationResult StableDiffusion::image2image(const GenerationConfig& config,
                                              const torch::Tensor& init,
                                              const StepCallback& on_step) {
  validate_generation_config(config, true, vae_scale_factor());
  accel::refuse_dit_cache_on_unet(config.dit_cache);
  accel::validate_accel_config(config, c_->unet_config);
  if (config.inpaint.mask.defined()) return inpaint(config, init, on_step);
  if (c_->unet_config.in_channels != latent_channels())
    throw InvalidArgument("this UNet is an inpainting UNet (in_channels " +
                          std::to_string(c_->unet_config.in_channels) +
                          "): it needs a mask (--mask; white = repaint) with its init image");
  torch::InferenceMode guard;
  double t0 = now_s();
  StageTimings timings;
  timings.lora_s = apply_loras(config.loras);
  int64_t batch = static_cast<int64_t>(config.prompts.size()) * config.images_per_prompt;
  const bool continues = config.denoising_start > 0;  // another run's latents, as they are
  int sf = vae_scale_factor();
  int64_t height = 0, width = 0;  // in pixels
  if (continues) {
    if (!config.latents.defined())
      throw InvalidArgument(
          "denoising_start continues another run from its latents: give them (latents; "
          "--latents FILE, which txt2img --denoising-end ... -o FILE.safetensors writes)");
    if (init.defined())
      throw InvalidArgument(
          "denoising_start continues from the given latents; an init image as well is "
          "ambiguous (give one or the other)");
    if (config.latents.defined() && config.latents.dim() == 4) {
      height = config.latents.size(2) * sf;
      width = config.latents.size(3) * sf;
    }
  } else {
    if (!init.defined() || init.dim() != 4 || init.size(1) != 3)
      throw InvalidArgument("init image must be [B, 3, H, W], got " +
                            (init.defined() ? c10::str(init.sizes()) : std::string("none")));
    if (init.size(0) != 1 && init.size(0) != batch && batch % init.size(0) != 0)
      throw InvalidArgument("init image batch " + std::to_string(init.size(0)) +
                            " does not divide the prompt batch " + std::to_string(batch));
    if (init.size(2) % sf != 0 || init.size(3) % sf != 0)
      throw InvalidArgument("init image size " + std::to_string(init.size(3)) + "x" +
                            std::to_string(init.size(2)) + " is not a multiple of " +
                            std::to_string(sf));
    height = init.size(2);
    width = init.size(3);
  }
  plan_memory_for(config, static_cast<int>(width), static_cast<int>(height), &timings);
  device::ScopedCpuThreads cpu_threads(
      cpu_threads_for(config, batch, static_cast<int>(width), static_cast<int>(height)));
  uint64_t seed = config.seed.value_or(random_seed());
  // Loaded and checked against the UNet before the text encoders run.
  const auto controlnets = controlnet_steps(config, height, width);
  auto embeds = encode_for_run(config, seed, t0, &timings);

  auto scheduler = make_scheduler(config);
  auto all = scheduler->timesteps();
  const int64_t begin = continues ? 0 : strength_begin(config, scheduler->order());
  const auto range = denoising_range(all, scheduler->num_train_timesteps(), scheduler->order(),
                                     config.denoising_start, config.denoising_end, begin);
  if (range.end <= range.begin)
    throw InvalidArgument((continues ? "denoising_start " + std::to_string(config.denoising_start)
                                     : "strength " + std::to_string(config.strength)) +
                          (config.denoising_end < 1
                               ? " and denoising_end " + std::to_string(config.denoising_end)
                               : std::string()) +
                          " with " + std::to_string(config.steps) +
                          " steps leave no denoising step; raise the steps or widen the range");
  auto timesteps = all.slice(0, range.begin, range.end);
  scheduler->set_begin_index(range.begin);
  if (continues) {
    // The previous expert's latents: no encode, no noise (diffusers: latents passed as image).
    auto latents = config.latents;
    check_input_tensor(latents, "given latents");
    if (latents.dim() != 4 || latents.size(1) != latent_channels() ||
        (latents.size(0) != 1 && latents.size(0) != batch))
      throw InvalidArgument("given latents have shape " + c10::str(latents.sizes()) +
                            ", expected [" + std::to_string(batch) + " or 1, " +
                            std::to_string(latent_channels()) + ", h, w] (a previous run's)");
    latents = latents.to(c_->device, torch::kFloat32);
    if (latents.size(0) != batch) latents = latents.repeat({batch, 1, 1, 1});
    auto gen = at::detail::createCPUGenerator(seed);
    DenoiseExtras extras;
    extras.controlnets = controlnets.get();
    auto result = denoise_and_decode(config, embeds, latents, timesteps, *scheduler, gen, on_step,
                                     timings, seed, &extras);
    result.timings.total_s = now_s() - t0;
    result.warnings.insert(result.warnings.begin(), embeds.warnings.begin(), embeds.warnings.end());
    return result;
  }

  auto gen = at::detail::createCPUGenerator(seed);
  double e0 = now_s();
  device::reset_peak_memory(c_->vae_device);
  // Contiguous NCHW whatever the caller's strides (an HWC image permuted is channels-last):
  // libtorch keeps channels-last through group_norm only on the CPU, so without this the same
  // image would take different kernels, and give different bits, on different devices.
  auto image = (init.to(torch::kFloat32).contiguous() * 2 - 1);
  trace("image_preprocessed", image);
  auto init_latents = encode_image_latents(image, batch, config, gen, "");
  c_->done_with(c_->vae_module, c_->vae_device);
  trace("init_latents", init_latents);
  timings.vae_encode_s = now_s() - e0;
  record_stage_memory(&timings, "vae_encode", c_->vae_device);
  torch::Tensor noise;
  if (config.noise.defined()) {
    check_input_tensor(config.noise, "given noise");
    if (config.noise.sizes() != init_latents.sizes())
      throw InvalidArgument("given noise has shape " + c10::str(config.noise.sizes()) +
                            ", expected " + c10::str(init_latents.sizes()));
    noise = config.noise.to(c_->device, torch::kFloat32);
  } else {
    noise = draw_noise(init_latents.sizes(), gen).to(c_->device);
  }
  auto latent_timestep = timesteps.slice(0, 0, 1).repeat({batch});
  trace("latent_timestep", latent_timestep);
  auto latents = scheduler->add_noise(init_latents, noise, latent_timestep);
  trace("noised_latents", latents);
  DenoiseExtras extras;
  extras.controlnets = controlnets.get();
  auto result = denoise_and_decode(config, embeds, latents, timesteps, *scheduler, gen, on_step,
                                   timings, seed, &extras);
  result.timings.total_s = now_s() - t0;
  result.warnings.insert(result.warnings.begin(), embeds.warnings.begin(), embeds.warnings.end());
  return result;
}

int64_t StableDiffusion::strength_begin(const GenerationConfig& config, int64_t order) {
  // diffusers' get_timesteps: run only the last `strength` part of the schedule.
  const int init_steps = std::min(static_cast<int>(config.steps * config.strength), config.steps);
  const int t_start = std::max(config.steps - init_steps, 0);
  return static_cast<int64_t>(t_start) * order;
}

std::unique_ptr<ControlNetSteps> StableDiffusion::controlnet_steps(const GenerationConfig& config,
                                                                   int64_t height, int64_t width) {
  if (config.controlnets.empty()) return nullptr;
  validate_controlnet_units(config.controlnets);
  std::vector<ControlNetStepUnit> units;
  for (size_t j = 0; j < config.controlnets.size(); ++j) {
    const auto& u = config.controlnets[j];
    auto it = c_->controlnets.find(u.model);
    if (it == c_->controlnets.end()) {
      // A folder's layout is checked from its config before its weights load.
      if (const auto cfg = models::read_controlnet_config(u.model))
        check_controlnet_fits(*cfg, c_->unet_config, vae_scale_factor(), u.model);
      auto net = models::load_controlnet(u.model, c_->device, c_->unet_dtype, &c_->unet_config);
      check_controlnet_fits(net->controlnet_config(), c_->unet_config, vae_scale_factor(), u.model);
      it = c_->controlnets.emplace(u.model, net).first;
    }
    ControlNetStepUnit unit;
    unit.net = it->second.get();
    const auto image = preprocess_control_image(
        u.preprocess.empty() ? u.image : apply_control_preprocessor(u.image, u.preprocess), height,
        width);
    trace("control_image." + std::to_string(j), image);
    unit.image = image.to(c_->device, c_->unet_dtype);
    unit.scale = u.scale;
    unit.start = u.start;
    unit.end = u.end;
    units.push_back(std::move(unit));
  }
  return std::make_unique<ControlNetSteps>(std::move(units), config.guess_mode);
}

torch::Tensor StableDiffusion::encode_image_latents(const torch::Tensor& image, int64_t batch,
                                                    const GenerationConfig& config,
                                                    at::Generator& gen,
                                                    const std::string& trace_prefix) {
  auto tiling = vae_tiling_for(config, image.size(0), image.size(2), image.size(3));
  auto dist = vae_encode(*c_->vae(), image.to(c_->vae_device, c_->vae_dtype), tiling.tiling);
  auto mean = dist.mean.to(torch::kFloat32), std = dist.std.to(torch::kFloat32);
  trace(trace_prefix + "posterior_mean", mean);
  trace(trace_prefix + "posterior_std", std);
  auto posterior_noise = draw_noise(mean.sizes(), gen).to(c_->vae_device);
  auto latents = c_->vae_config.to_latents(mean + std * posterior_noise).to(c_->device);
  check_stage_finite(latents, "VAE encoder", c_->vae_device, c_->vae_dtype);
  if (latents.size(0) != batch) latents = latents.repeat({batch / latents.size(0), 1, 1, 1});
  return latents;
}

GenerationResult StableDiffusion::inpaint(const GenerationConfig& config, const torch::Tensor& init,
                                          const StepCallback& on_step) {
  const auto& opt = config.inpaint;
  validate_inpaint_fill(opt.fill);
  if (config.denoising_start > 0)
    throw InvalidArgument(
        "inpainting starts from its source image: denoising_start (continuing "
        "another run's latents) does not apply to a masked run");
  if (!init.defined() || init.dim() != 4 || init.size(0) != 1 || init.size(1) != 3)
    throw InvalidArgument("inpainting takes one source image [1, 3, H, W], got " +
                          (init.defined() ? c10::str(init.sizes()) : std::string("none")));
  const int64_t lc = latent_channels();
  const bool concat = c_->unet_config.in_channels == 2 * lc + 1;
  if (!concat && c_->unet_config.in_channels != lc)
    throw ConfigError(c_->unet_config.source + ": in_channels " +
                      std::to_string(c_->unet_config.in_channels) + " is neither the latents' " +
                      std::to_string(lc) + " nor an inpainting UNet's " +
                      std::to_string(2 * lc + 1));
  torch::InferenceMode guard;
  const double t0 = now_s();
  const int64_t sf = vae_scale_factor();
  // The source as the 8-bit picture it was (the caller's [0, 1] floats are u8 / 255).
  const auto source =
      (init[0].permute({1, 2, 0}) * 255).round().clamp(0, 255).to(torch::kUInt8).contiguous();
  const int64_t H0 = source.size(0), W0 = source.size(1);
  const int64_t height = config.height ? config.height : H0 / sf * sf;
  const int64_t width = config.width ? config.width : W0 / sf * sf;
  if (height < sf || width < sf)
    throw InvalidArgument("inpainting: the image is smaller than the VAE's factor " +
                          std::to_string(sf));
  const auto prepared = prepare_inpaint(opt, source, height, width);
  if (prepared.box)
    trace("crops_coords",
          torch::tensor(std::vector<int64_t>(prepared.box->begin(), prepared.box->end())));
  const auto& image_u8 = prepared.image;
  const auto& mask = prepared.mask;
  StageTimings timings;
  plan_memory_for(config, static_cast<int>(width), static_cast<int>(height), &timings);
  const int64_t batch = static_cast<int64_t>(config.prompts.size()) * config.images_per_prompt;
  device::ScopedCpuThreads cpu_threads(
      cpu_threads_for(config, batch, static_cast<int>(width), static_cast<int>(height)));
  timings.lora_s = apply_loras(config.loras);
  const uint64_t seed = config.seed.value_or(random_seed());
  // Loaded and checked against the UNet before the text encoders run.
  const auto controlnets = controlnet_steps(config, height, width);
  auto embeds = encode_for_run(config, seed, t0, &timings);

  auto scheduler = make_scheduler(config);
  const auto all = scheduler->timesteps();
  const auto range =
      denoising_range(all, scheduler->num_train_timesteps(), scheduler->order(), 0,
                      config.denoising_end, strength_begin(config, scheduler->order()));
  if (range.end <= range.begin)
    throw InvalidArgument("strength " + std::to_string(config.strength) + " with " +
                          std::to_string(config.steps) +
                          " steps leaves no denoising step; raise the steps or the strength");
  const auto timesteps = all.slice(0, range.begin, range.end);
  scheduler->set_begin_index(range.begin);

  auto gen = at::detail::createCPUGenerator(seed);
  const double e0 = now_s();
  device::reset_peak_memory(c_->vae_device);
  const auto image =
      (image_u8.to(torch::kFloat32) / 255).permute({2, 0, 1}).unsqueeze(0).contiguous() * 2 - 1;
  trace("image_preprocessed", image);
  trace("mask_preprocessed", mask);
  // diffusers' draw order: the source's latents (when a blend or strength < 1 needs them),
  // then the initial noise, then the masked image's latents.
  const bool full_strength = config.strength >= 1;
  const int64_t h = height / sf, w = width / sf;
  InpaintLatents ip;
  ip.concat = concat;
  ip.mask = latent_mask(mask, h, w).repeat({batch, 1, 1, 1}).to(c_->device);
  if (!concat || !full_strength) {
    // A1111's "fill": the masked region painted from its surroundings before encoding.
    const auto source_image = opt.fill == "fill"
                                  ? (fill_masked_region(image_u8, mask).to(torch::kFloat32) / 255)
                                                .permute({2, 0, 1})
                                                .unsqueeze(0)
                                                .contiguous() *
                                            2 -
                                        1
                                  : image;
    ip.image_latents = encode_image_latents(source_image, batch, config, gen, "");
    trace("image_latents", ip.image_latents);
  }
  ip.noise = draw_noise({batch, lc, h, w}, gen).to(c_->device);
  torch::Tensor latents;
  if (full_strength) {
    latents = ip.noise * scheduler->init_noise_sigma();
  } else {
    // What the masked region starts from (A1111's inpainting_fill; "original" = diffusers).
    auto start = ip.image_latents;
    if (opt.fill == "latent_noise")
      start = start * (1 - ip.mask) + draw_noise(start.sizes(), gen).to(c_->device) * ip.mask;
    else if (opt.fill == "latent_nothing")
      start = start * (1 - ip.mask);
    const auto latent_timestep = timesteps.slice(0, 0, 1).repeat({batch});
    trace("latent_timestep", latent_timestep);
    latents = scheduler->add_noise(start, ip.noise, latent_timestep);
  }
  trace("init_latents", latents);
  ip.masked_image_latents =
      encode_image_latents(masked_image(image, mask), batch, config, gen, "masked_");
  c_->done_with(c_->vae_module, c_->vae_device);
  const bool guidance = embeds.negative.defined();
  trace("mask_latent", guidance ? torch::cat({ip.mask, ip.mask}) : ip.mask);
  trace("masked_image_latents", guidance
                                    ? torch::cat({ip.masked_image_latents, ip.masked_image_latents})
                                    : ip.masked_image_latents);
  timings.vae_encode_s = now_s() - e0;
  record_stage_memory(&timings, "vae_encode", c_->vae_device);

  DenoiseExtras extras;
  extras.inpaint = std::move(ip);
  extras.controlnets = controlnets.get();
  auto result = denoise_and_decode(config, embeds, latents, timesteps, *scheduler, gen, on_step,
                                   timings, seed, &extras);
  if (prepared.box && !result.images.empty()) {
    // "Inpaint only masked": the generated crop pasted back over the untouched source.
    std::vector<torch::Tensor> pasted;
    for (auto& img : result.images) {
      const auto generated = image_to_tensor(img);
      trace("image_generated_u8", generated.unsqueeze(0));
      const auto out = finish_inpaint(prepared, generated);
      img.height = static_cast<int>(out.size(0));
      img.width = static_cast<int>(out.size(1));
      img.rgb.assign(out.data_ptr<uint8_t>(), out.data_ptr<uint8_t>() + out.numel());
      pasted.push_back(out);
    }
    const auto stacked = torch::stack(pasted);
    trace("image_out_u8", stacked);
    result.images_float = stacked.to(torch::kFloat32) / 255;
  }
  result.timings.total_s = now_s() - t0;
  result.warnings.insert(result.warnings.begin(), embeds.warnings.begin(), embeds.warnings.end());
  return result;
}

}  // namespace diffuse::pipeline
