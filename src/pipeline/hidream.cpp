#include "pipeline/hidream.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "adapters/lora.h"
#include "device/cpu_allocator.h"
#include "device/cpu_load.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "device/memory.h"
#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/load_component.h"
#include "parallel/branch_split.h"
#include "parallel/replicated.h"
#include "parallel/ulysses.h"
#include "pipeline/denoised_estimate.h"
#include "pipeline/finite_check.h"
#include "pipeline/flow_decode.h"
#include "pipeline/flow_denoise.h"
#include "pipeline/hidream_variant.h"
#include "pipeline/initial_noise.h"
#include "pipeline/inpaint_mask.h"
#include "pipeline/memory_plan_folder.h"
#include "pipeline/memory_report.h"
#include "pipeline/transformer_streaming.h"
#include "pipeline/vae_tiling_policy.h"
#include "schedulers/flow_match.h"

namespace diffuse::pipeline {
namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void require_guidance_inputs(double g, const char* what) {
  if (!std::isfinite(g)) throw InvalidArgument(std::string(what) + " must be a finite number");
}

}  // namespace

bool is_hidream_folder(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path) || !fs::exists(fs::path(path) / "model_index.json")) return false;
  return io::ModelFolder::open(path)
             .model_index()
             .get<std::string>("_class_name", "")
             .rfind("HiDream", 0) == 0;
}

HiDreamPlacement hidream_placement(const std::string& text_encoder_device,
                                   const std::string& vae_device, const std::string& dtype) {
  HiDreamPlacement p;
  if (!text_encoder_device.empty()) {
    p.text_device = device::resolve_device(text_encoder_device);
    p.text_dtype = device::resolve_dtype(dtype, *p.text_device, "text_encoder");
  }
  if (!vae_device.empty()) p.vae_device = device::resolve_device(vae_device);
  return p;
}

HiDreamPipeline::HiDreamPipeline(const io::ModelFolder& folder, torch::Device device,
                                 torch::Dtype dtype, const std::string& transformer_component,
                                 const HiDreamPlacement& placement)
    : device_(device),
      dtype_(dtype),
      text_device_(placement.text_device.value_or(device)),
      vae_device_(placement.vae_device.value_or(device)),
      text_dtype_(placement.text_dtype.value_or(dtype)),
      folder_(folder),
      transformer_component_(transformer_component),
      tconfig_(models::HiDreamTransformerConfig::from_json(models::component_config(
          folder, transformer_component, "HiDreamImageTransformer2DModel"))) {
  // Freed activations stay in the heap for the next block instead of being unmapped and
  // faulted in again (device/cpu_allocator.h), as the Stable Diffusion pipeline does.
  device::configure_cpu_threads();  // the CLI alone left LibTorch at one thread per core
  device::set_cpu_memory_policy();
  // All four encoders (and their tokenizers) are needed for any prompt: a folder without one
  // is refused now, before anything loads, not after minutes of loading the others.
  for (const char* component :
       {"text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4", "tokenizer",
        "tokenizer_2", "tokenizer_3", "tokenizer_4", "vae", "scheduler"})
    if (!folder.has_component(component))
      throw IoError("HiDream model folder '" + folder.dir() + "' has no " + component +
                    "/ (a HiDream pipeline needs CLIP-L, CLIP-G, T5 and Llama text encoders with "
                    "their tokenizers, the VAE and the scheduler)");
  max_sequence_length_ = hidream_max_sequence_length(folder);
  vae_ = models::load_vae(folder, vae_device_, torch::kFloat32);
  scheduler_ =
      schedulers::make_scheduler(folder.component_config("scheduler", "scheduler_config.json"));
}

HiDreamTextEncoders& HiDreamPipeline::text_encoders() {
  if (!text_)
    text_ = std::make_unique<HiDreamTextEncoders>(folder_, text_device_, text_dtype_,
                                                  plan_ && plan_->text_one_at_a_time);
  return *text_;
}

MemoryPlan HiDreamPipeline::plan(int64_t width, int64_t height, int64_t reference_images,
                                 const VaeTilingOptions& vae_tiling) const {
  return plan_generation(folder_, plan_options(), width, height, reference_images, vae_tiling,
                         nullptr);
}

FolderPlanOptions HiDreamPipeline::plan_options() const {
  auto o = pipeline_plan_options(device_, dtype_, transformer_component_, weight_streaming_,
                                 weight_type_, keep_text_encoders_, max_memory_);
  o.text_device = text_device_;
  o.vae_device = vae_device_;
  return o;
}

void HiDreamPipeline::follow_plan(int64_t width, int64_t height, int64_t reference_images,
                                  const VaeTilingOptions& vae_tiling, StageTimings& timings) {
  auto p = plan_generation(folder_, plan_options(), width, height, reference_images, vae_tiling,
                           &timings);
  // A transformer with merged adapters stays (reloading would lose them).
  if (p.free_denoiser_for_text && transformer_ && !lora_) {
    transformer_ = nullptr;
    quantized_ = {};
    device::empty_cache(device_);
  }
  plan_ = std::move(p);
}

void HiDreamPipeline::set_weight_streaming(const std::string& mode) {
  check_weight_streaming_mode(mode, weight_streaming_, static_cast<bool>(transformer_),
                              weight_type_);
  weight_streaming_ = mode;
}

void HiDreamPipeline::set_weight_type(const std::string& type) {
  const auto parsed = quant::parse_weight_type(type, "weight type");
  check_weight_type_change(type, parsed, weight_type_, static_cast<bool>(transformer_),
                           weight_streaming_);
  weight_type_ = parsed;
}

models::HiDreamImageTransformer2DModel& HiDreamPipeline::transformer() {
  if (transformer_) return transformer_;
  // Streaming reads plain safetensors weights: not for quantized ones (--weights, a GGUF).
  const bool quantized = weight_type_ || models::component_is_gguf(folder_, transformer_component_);
  bool stream = weight_streaming_ == "on";
  // "auto": the plan's choice (made for a generation, or for the default size when an adapter
  // loads the transformer before any).
  if (weight_streaming_ == "auto" && !quantized) {
    if (!plan_) plan_ = plan_folder(folder_, plan_options());
    stream = plan_->stream_denoiser;
  }
  transformer_ = models::load_hidream_transformer(folder_, device_, dtype_, transformer_component_,
                                                  stream, weight_type_, &quantized_);
  return transformer_;
}

void HiDreamPipeline::check_text_stage(const HiDreamEmbeddings& e) const {
  for (const auto* t : {&e.pooled, &e.t5, &e.llama})
    check_stage_finite(*t, "text encoder", text_device_, text_dtype_);
}

std::vector<HiDreamEmbeddings> HiDreamPipeline::encode_prompts(
    const std::vector<std::string>& prompts, int64_t max_sequence_length) {
  auto all = text_encoders().encode_each(prompts, max_sequence_length);
  for (auto& e : all) {
    check_text_stage(e);
    e = e.to(device_);
  }
  return all;
}

void HiDreamPipeline::end_text_stage(double start, StageTimings& timings) {
  if (!keep_text_encoders_ || (plan_ && !plan_->keep_text_encoders)) {
    text_.reset();
    device::empty_cache(text_device_);  // their memory back before the transformer loads
  }
  timings.text_encode_s = now_s() - start;
  record_stage_memory(&timings, "text_encode", text_device_);
}

void HiDreamPipeline::set_scheduler(std::unique_ptr<schedulers::Scheduler> scheduler) {
  scheduler_ = std::move(scheduler);
}

std::pair<int, int> HiDreamPipeline::normalized_size(int width, int height, int area_side) const {
  if (width <= 0 || height <= 0 || area_side <= 0)
    throw InvalidArgument("width, height and the area side must be positive, got " +
                          std::to_string(width) + "x" + std::to_string(height) + " and " +
                          std::to_string(area_side));
  const int64_t division = size_multiple();
  const double scale =
      std::sqrt(static_cast<double>(area_side) * area_side / (static_cast<double>(width) * height));
  auto fit = [&](int v) { return static_cast<int>(std::floor(v * scale / division) * division); };
  const int w = fit(width), h = fit(height);
  if (w <= 0 || h <= 0)
    throw InvalidArgument("a " + std::to_string(width) + "x" + std::to_string(height) +
                          " image has no side of at least " + std::to_string(division) +
                          " pixels at the model's area");
  return {w, h};
}

torch::Tensor HiDreamPipeline::initial_latents(const HiDreamSampling& s, int64_t h,
                                               int64_t w) const {
  return initial_flow_latents(s.latents, s.seed, tconfig_.in_channels, h, w, device_);
}

void HiDreamPipeline::prepare_schedule(int steps) {
  if (steps < 1) throw InvalidArgument("steps must be >= 1, got " + std::to_string(steps));
  // diffusers' HiDream pipelines: UniPC gets no mu; the others get mu from the transformer's
  // max_seq (used only with dynamic shifting).
  if (std::string(scheduler_->class_name()) != "UniPCMultistepScheduler")
    scheduler_->set_shift_mu(schedulers::calculate_shift(tconfig_.max_seq()));
  scheduler_->set_timesteps(steps);
}

torch::Tensor HiDreamPipeline::run_transformer(const torch::Tensor& input, const torch::Tensor& t,
                                               const HiDreamEmbeddings& text,
                                               const models::HiDreamForwardOptions& fwd,
                                               HiDreamStep& step) {
  auto ts = t.to(device_, torch::kFloat32).reshape({1}).expand({input.size(0)});
  auto options = fwd;
  options.cache = cache_.get();
  options.sequence_group = sequence_group_.get();
  torch::Tensor raw;
  const int64_t batch = input.size(0);  // one image per guidance branch
  if (cfg_group_ && batch >= cfg_group_->size()) {
    parallel::BranchShard shard(*cfg_group_, static_cast<int>(batch));
    const auto mine = [&](const torch::Tensor& x, int64_t dim) {
      return x.narrow(dim, shard.range().first, shard.range().count);
    };
    raw = shard.gather(transformer()
                           ->forward(mine(input, 0), mine(ts, 0), mine(text.t5, 0),
                                     mine(text.llama, 1), mine(text.pooled, 0), options)
                           .to(torch::kFloat32));
  } else {
    raw = transformer()
              ->forward(input, ts, text.t5, text.llama, text.pooled, options)
              .to(torch::kFloat32);
  }
  step.transformer_input = input;
  step.transformer_timesteps = ts;
  step.transformer_out = raw;
  return -raw;
}

torch::Tensor HiDreamPipeline::denoise(const HiDreamSampling& s, torch::Tensor latents,
                                       const Velocity& velocity, HiDreamResult& out,
                                       const InpaintLatents* inpaint) {
  auto& timings = out.timings;
  const double start = now_s();
  device::reset_peak_memory(device_);
  // Both cores for a real model, one for a tiny one (device/cpu_threads.h); the image tokens
  // twice (guidance, or an edit's source) and the text's.
  const int64_t tokens =
      2 * (latents.size(2) / tconfig_.patch_size) * (latents.size(3) / tconfig_.patch_size) +
      2 * sequence_length(s);
  device::ScopedCpuThreads threads(
      device::threads_for_step_work(plan_ ? denoiser_call_flops(*plan_, tokens) : 0.0));
  device::CpuShareMeter cpu_meter(at::get_num_threads());
  cache_.reset();
  if (s.cache.method != DitCacheOptions::Method::kOff)
    cache_ =
        std::make_unique<accel::DitCache>(s.cache, tconfig_.num_layers, tconfig_.num_single_layers);
  FlowDenoiseInputs in;
  in.seed = s.seed;
  in.step_noise = &s.step_noise;
  in.device = device_;
  in.inpaint = inpaint;
  if (cache_) in.begin_step = [this](int step, int total) { cache_->begin_step(step, total); };
  if (cache_ && cfg_group_) cache_->set_branch_sum(parallel::sum_over_ranks(*cfg_group_));
  std::function<StepAction(const HiDreamStep&)> on_step = s.on_step;
  if (sequence_group_ || cfg_group_)
    on_step = [&](const HiDreamStep& st) -> StepAction {
      const std::string what = "latents after step " + std::to_string(st.index + 1);
      // Equal within every token group and every branch group: equal everywhere.
      for (auto* g : {sequence_group_.get(), cfg_group_.get()})
        if (g) parallel::check_replicated(*g, st.latents, what);
      return s.on_step ? s.on_step(st) : StepAction(true);
    };
  auto run = flow_denoise<HiDreamStep>(*scheduler_, latents, in, velocity, on_step, timings.step_s);
  latents = run.latents;
  out.steps_run = run.steps_run;
  out.interrupted = run.interrupted;
  if (run.interrupted) out.warnings.push_back(run.warning);
  timings.denoise_s = now_s() - start;
  timings.cpu = cpu_meter.share();
  if (cache_) out.cache = cache_->stats();
  cache_.reset();
  check_stage_finite(latents, "denoising (transformer)", device_, dtype_);
  record_stage_memory(&timings, "denoise", device_);
  device::empty_cache(device_);  // the transformer's freed activations, before the decoder's peak
  return latents;
}

void HiDreamPipeline::decode(const torch::Tensor& latents, const VaeTilingOptions& tiling,
                             HiDreamResult& out) {
  out.image = decode_flow_latents(vae_, latents, tiling, vae_device_, out.timings, out.warnings);
}

void HiDreamPipeline::set_sequence_group(std::shared_ptr<parallel::RankGroup> group) {
  if (group) parallel::check_ulysses_group(tconfig_.num_attention_heads, group->size());
  sequence_group_ = std::move(group);
}

void HiDreamPipeline::check_cache(const DitCacheOptions& cache) const {
  if (cache.method == DitCacheOptions::Method::kOff) return;
  const accel::DitCache check(cache, tconfig_.num_layers, tconfig_.num_single_layers);
  (void)check;  // the constructor checks the block range against this model
}

HiDreamResult HiDreamPipeline::text_to_image(const HiDreamTextToImage& r) {
  require_guidance_inputs(r.sampling.guidance_scale, "guidance_scale");
  check_cache(r.sampling.cache);
  torch::InferenceMode inference;
  const auto [width, height] =
      normalized_size(r.width, r.height, r.area_side > 0 ? r.area_side : area_side());
  const bool cfg = r.sampling.guidance_scale > 1.0;
  HiDreamResult out;
  const double start = now_s();
  follow_plan(width, height, 0, r.sampling.vae_tiling, out.timings);
  device::reset_peak_memory(text_device_);
  auto prompts = cfg ? encode_prompts({r.prompt, r.negative_prompt}, sequence_length(r.sampling))
                     : encode_prompts({r.prompt}, sequence_length(r.sampling));
  out.prompt_embeddings = prompts[0];
  HiDreamEmbeddings cond = out.prompt_embeddings;
  if (cfg) {
    out.negative_embeddings = prompts[1];
    cond = HiDreamEmbeddings::cat({&out.negative_embeddings, &out.prompt_embeddings});
  }
  end_text_stage(start, out.timings);
  prepare_schedule(r.sampling.steps);
  auto latents =
      initial_latents(r.sampling, height / vae_scale_factor(), width / vae_scale_factor());
  auto velocity = [&](const torch::Tensor& x, const torch::Tensor& t, HiDreamStep& step) {
    auto pred = run_transformer(cfg ? torch::cat({x, x}, 0) : x, t, cond, {}, step);
    if (!cfg) return pred;
    auto parts = pred.chunk(2, 0);
    return parts[0] + r.sampling.guidance_scale * (parts[1] - parts[0]);
  };
  latents = denoise(r.sampling, latents, velocity, out);
  out.latents = latents.to(torch::kCPU);
  decode(latents, r.sampling.vae_tiling, out);
  out.timings.total_s = now_s() - start;
  return out;
}

HiDreamResult HiDreamPipeline::edit(const HiDreamEdit& r) {
  require_guidance_inputs(r.sampling.guidance_scale, "guidance_scale");
  check_cache(r.sampling.cache);
  require_guidance_inputs(r.image_guidance_scale, "image_guidance_scale");
  if (!(r.refine_strength >= 0.0 && r.refine_strength <= 1.0))
    throw InvalidArgument("refine_strength must be in [0, 1], got " +
                          std::to_string(r.refine_strength));
  const int switch_step = static_cast<int>(r.sampling.steps * (1.0 - r.refine_strength));
  const bool refine = switch_step < r.sampling.steps;
  if (refine && !editing_adapter_)
    throw InvalidArgument(
        "refine_strength > 0 runs the last steps on HiDream-I1's weights: load the model as "
        "I1 + the E1 LoRA file (HiDream-E1-Full) to use it, or set refine_strength to 0");
  if (r.inpaint.mask.defined() && r.inpaint.crop_padding >= 0)
    throw InvalidArgument(
        "mask crop (inpaint only masked) is for image-to-image; an edit sees the whole source");
  torch::InferenceMode inference;
  HiDreamResult out;
  const double start = now_s();
  device::reset_peak_memory(vae_device_);
  // VaeImageProcessor: [0, 255] -> [-1, 1], NCHW; E1 encodes with the mode (the mean).
  auto pixels = edit_source_pixels(r.image);
  // A mask at the edit's size, checked before anything heavier runs.
  std::optional<PreparedInpaint> masked;
  if (r.inpaint.mask.defined())
    masked = prepare_inpaint(r.inpaint, r.image, pixels.size(2), pixels.size(3));
  // E1 puts the source's tokens beside the target's.
  follow_plan(pixels.size(3), pixels.size(2), 1, r.sampling.vae_tiling, out.timings);
  const auto& vc = vae_->config();
  const auto tiling = choose_vae_tiling(r.sampling.vae_tiling, vc, 1, pixels.size(2),
                                        pixels.size(3), vae_device_, torch::kFloat32);
  out.image_latents = vc.to_latents(vae_encode(*vae_, pixels.to(vae_device_), tiling.tiling).mean)
                          .to(torch::kFloat32);
  check_stage_finite(out.image_latents, "VAE encoder", vae_device_, torch::kFloat32);
  out.image_latents = out.image_latents.to(device_);
  const int64_t h = out.image_latents.size(2), w = out.image_latents.size(3);
  out.timings.vae_encode_s = now_s() - start;
  record_stage_memory(&out.timings, "vae_encode", vae_device_);

  const double text_start = now_s();
  device::reset_peak_memory(text_device_);
  std::vector<std::string> texts{r.prompt, r.negative_prompt};
  if (refine) texts.push_back(target_description(r));
  auto encoded = encode_prompts(texts, sequence_length(r.sampling));
  out.prompt_embeddings = encoded[0];
  out.negative_embeddings = encoded[1];
  const auto& pos = out.prompt_embeddings;
  const auto& neg = out.negative_embeddings;
  auto text = r.clip_cfg_norm ? HiDreamEmbeddings::cat({&pos, &neg, &pos})
                              : HiDreamEmbeddings::cat({&neg, &neg, &pos});
  HiDreamEmbeddings target_text;
  if (refine) {
    out.target_embeddings = encoded[2];
    target_text = HiDreamEmbeddings::cat({&neg, &out.target_embeddings});
  }
  end_text_stage(text_start, out.timings);
  prepare_schedule(r.sampling.steps);
  auto latents = initial_latents(r.sampling, h, w);
  // [zeros, image, image] beside the three copies of the noisy latents.
  auto image_side =
      torch::cat({torch::zeros_like(out.image_latents), out.image_latents, out.image_latents}, 0);
  models::HiDreamForwardOptions fwd;
  fwd.max_seq = (h / tconfig_.patch_size) * (2 * w / tconfig_.patch_size);
  const double g = r.sampling.guidance_scale, ig = r.image_guidance_scale;
  int step_index = 0;
  auto velocity = [&](const torch::Tensor& x, const torch::Tensor& t, HiDreamStep& step) {
    if (refine && step_index++ >= switch_step) {
      // Refine: the low-rank updates off, 2-way guidance on the target description, no source
      // image.
      // What the reference computes (pipe_e1_clipnorm_refine0.5 agrees to 1.5e-5 this way and
      // by 6.3 with the I1 values of the file's full tensors restored): peft's
      // disable_adapters(), the full tensors (x_embedder) stay E1's.
      lora_->set_lora_enabled(false);
      auto parts = run_transformer(torch::cat({x, x}, 0), t, target_text, fwd, step).chunk(2, 0);
      return parts[0] + g * (parts[1] - parts[0]);
    }
    auto input = torch::cat({torch::cat({x, x, x}, 0), image_side}, 3);
    auto pred = run_transformer(input, t, text, fwd, step).narrow(3, 0, w);  // the left half
    auto parts = pred.chunk(3, 0);
    const auto &uncond = parts[0], &image_cond = parts[1], &full = parts[2];
    if (!r.clip_cfg_norm) return uncond + ig * (image_cond - uncond) + g * (full - image_cond);
    auto text_pred = image_cond + g * (full - image_cond);
    auto scale = (full.norm(2, 1, true) / (text_pred.norm(2, 1, true) + 1e-8)).clamp(0.0, 1.0);
    return uncond + ig * (text_pred * scale - uncond);
  };
  struct RestoreEditingWeights {
    HiDreamPipeline* p;
    ~RestoreEditingWeights() { p->apply_editing_lora(); }
  } restore{this};
  std::optional<InpaintLatents> ip;
  if (masked) {
    // Outside the mask the target is the source itself (same size: E1 edits at the source's).
    ip.emplace();
    ip->mask = latent_mask(masked->mask, h, w).to(device_);
    ip->image_latents = out.image_latents;
    ip->noise = latents;
  }
  latents = denoise(r.sampling, latents, velocity, out, ip ? &*ip : nullptr);
  out.latents = latents.to(torch::kCPU);
  decode(latents, r.sampling.vae_tiling, out);
  out.timings.total_s = now_s() - start;
  return out;
}

int HiDreamPipeline::area_side() const {
  const auto& mr = tconfig_.max_resolution;
  return static_cast<int>(
      std::lround(std::sqrt(static_cast<double>(mr[0] * mr[1])) * vae_scale_factor()));
}

int64_t HiDreamPipeline::vae_scale_factor() const {
  return vae_->config().spatial_factor();
}

std::pair<int64_t, int64_t> HiDreamPipeline::edit_size(int64_t W, int64_t H) const {
  const int64_t division = size_multiple();
  // At most the model's area, sides multiples of the patch in pixels, aspect kept (HiDream-E1.1's
  // dynamic resolution); images that already fit are used as they are.
  const double fit = std::min(1.0, std::sqrt(static_cast<double>(area_side()) * area_side() /
                                             (static_cast<double>(H) * static_cast<double>(W))));
  const int64_t h =
      static_cast<int64_t>(std::floor(static_cast<double>(H) * fit / division)) * division;
  const int64_t w =
      static_cast<int64_t>(std::floor(static_cast<double>(W) * fit / division)) * division;
  if (h < division || w < division)
    throw InvalidArgument("the source image is " + std::to_string(W) + "x" + std::to_string(H) +
                          "; each side needs at least " + std::to_string(division) +
                          " pixels at the model's area");
  return {w, h};
}

torch::Tensor HiDreamPipeline::edit_source_pixels(const torch::Tensor& image) const {
  constexpr int64_t kMaxSourcePixels = int64_t{64} << 20;  // 64 MP: beyond any real photo
  if (!image.defined() || image.dim() != 3 || image.size(2) != 3 ||
      image.scalar_type() != torch::kUInt8)
    throw InvalidArgument("the source image must be uint8 [H, W, 3], got " +
                          (image.defined() ? c10::str(image.sizes()) : std::string("none")));
  const int64_t H = image.size(0), W = image.size(1);
  if (H * W > kMaxSourcePixels)
    throw InvalidArgument("the source image is " + std::to_string(W) + "x" + std::to_string(H) +
                          " (" + std::to_string(H * W / 1000000) +
                          " MP); at most 64 MP are accepted (it is scaled to about " +
                          std::to_string(area_side()) + "x" + std::to_string(area_side()) +
                          " anyway)");
  const auto [w, h] = edit_size(W, H);
  auto x = image.to(torch::kFloat32).permute({2, 0, 1}).unsqueeze(0);
  if (h != H || w != W) {
    namespace F = torch::nn::functional;
    // Area averaging when shrinking (no aliasing), bicubic when a side grows.
    const bool shrink = h <= H && w <= W;
    auto opts = F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w});
    if (shrink)
      opts.mode(torch::kArea);
    else
      opts.mode(torch::kBicubic).align_corners(false);
    x = F::interpolate(x, opts).clamp(0, 255);
  }
  return x / 255.0 * 2 - 1;
}

std::string HiDreamPipeline::target_description(const HiDreamEdit& r) {
  if (!r.target_prompt.empty()) return r.target_prompt;
  // HiDream-E1-Full prompts: "Editing Instruction: ... Target Image Description: ...".
  static const std::string kMarker = "Target Image Description:";
  const auto pos = r.prompt.find(kMarker);
  if (pos == std::string::npos) return r.prompt;
  auto target = r.prompt.substr(pos + kMarker.size());
  const auto first = target.find_first_not_of(" \t\n");
  const auto last = target.find_last_not_of(" \t\n");
  return first == std::string::npos ? std::string() : target.substr(first, last - first + 1);
}

adapters::LoraMerger& HiDreamPipeline::lora_merger(const char* what) {
  if (lora_) return *lora_;
  transformer();  // loaded, and with it what was kept quantized
  if (quantized_.layers > 0)
    throw InvalidArgument(std::string(what) +
                          " merges into the transformer's plain weights, which quantized weights "
                          "(--weights, or a GGUF transformer) give up; run without --weights and "
                          "with a safetensors transformer");
  if (transformer()->stream && !transformer()->stream->zero_copy())
    throw InvalidArgument(std::string(what) +
                          " with a streamed transformer needs it on the cpu with its weight files "
                          "in the compute dtype (" +
                          device::dtype_name(dtype_) + "); use --stream-weights off");
  lora_ = std::make_unique<adapters::LoraMerger>(
      std::vector<adapters::Network>{{io::lora::transformer_names(), transformer().get()}});
  return *lora_;
}

void HiDreamPipeline::set_editing_lora(const std::string& path,
                                       const adapters::LoraOptions& options) {
  auto& merger = lora_merger("the E1-Full LoRA");
  // Read and checked once; merged now and again after every refine phase.
  editing_adapter_ = std::make_shared<adapters::LoraAdapter>(
      adapters::load_lora(path, merger.networks(), options));
  apply_editing_lora();
}

void HiDreamPipeline::apply_editing_lora() {
  if (!lora_) return;
  if (editing_adapter_ && editing_lora_id_ < 0)
    editing_lora_id_ = lora_->add(*editing_adapter_, 1.0);
  lora_->set_lora_enabled(true);
}

std::string HiDreamPipeline::add_lora(const std::string& path, double scale,
                                      const adapters::LoraOptions& options) {
  if (!std::isfinite(scale))
    throw InvalidArgument("LoRA '" + path + "': the scale must be a finite number");
  auto& merger = lora_merger("a LoRA");
  const int id = merger.add(path, scale, options);
  return adapters::describe(merger.adapter(id), path, scale);
}

}  // namespace diffuse::pipeline
