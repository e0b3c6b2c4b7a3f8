#include "pipeline/flux.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "adapters/lora.h"
#include "device/cpu_allocator.h"
#include "device/cpu_load.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "device/memory.h"
#include "diffuse/errors.h"
#include "io/lora_key_map.h"
#include "io/pillow_resample.h"
#include "models/clip_text_model.h"
#include "models/flux_bfl_names.h"
#include "models/load_component.h"
#include "nn/layers.h"
#include "parallel/replicated.h"
#include "parallel/ulysses.h"
#include "pipeline/finite_check.h"
#include "pipeline/flow_decode.h"
#include "pipeline/flow_denoise.h"
#include "pipeline/initial_noise.h"
#include "pipeline/memory_plan_folder.h"
#include "pipeline/memory_report.h"
#include "pipeline/transformer_streaming.h"
#include "pipeline/vae_tiling_policy.h"
#include "quant/quantized_weight.h"
#include "schedulers/flow_match.h"

namespace diffuse::pipeline {
namespace {

double flux_clock_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void require_finite_scale(double v, const char* what) {
  if (!std::isfinite(v)) throw InvalidArgument(std::string(what) + " must be a finite number");
}

std::string flux_size_text(int64_t w, int64_t h) {
  return std::to_string(w) + "x" + std::to_string(h);
}

constexpr int64_t kFluxMaxSourcePixels = int64_t{64} << 20;  // 64 MP: beyond any real photo
constexpr int kFluxMaxSide = 8192;

}  // namespace

bool is_flux_folder(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path) || !fs::exists(fs::path(path) / "model_index.json")) return false;
  return io::ModelFolder::open(path)
             .model_index()
             .get<std::string>("_class_name", "")
             .rfind("Flux", 0) == 0;
}

const std::vector<std::pair<int, int>>& kontext_resolutions() {
  static const std::vector<std::pair<int, int>> k = {
      {672, 1568}, {688, 1504}, {720, 1456},  {752, 1392}, {800, 1328}, {832, 1248},
      {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944}, {1184, 880}, {1248, 832},
      {1328, 800}, {1392, 752}, {1456, 720},  {1504, 688}, {1568, 672}};
  return k;
}

FluxPipeline::FluxPipeline(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype,
                           const std::string& transformer_component)
    : device_(device),
      dtype_(dtype),
      folder_(folder),
      transformer_component_(transformer_component),
      tconfig_(models::FluxTransformerConfig::from_json(
          models::component_config(folder, transformer_component, "FluxTransformer2DModel"))) {
  device::configure_cpu_threads();  // the CLI alone left LibTorch at one thread per core
  device::set_cpu_memory_policy();
  // Everything a prompt needs is checked now, before minutes of loading the rest.
  for (const char* component :
       {"text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "vae", "scheduler"})
    if (!folder.has_component(component))
      throw IoError("FLUX model folder '" + folder.dir() + "' has no " + component +
                    "/ (a FLUX pipeline needs the CLIP and T5 text encoders with their "
                    "tokenizers, the VAE and the scheduler)");
  kontext_ = folder.model_index().get<std::string>("_class_name", "") == "FluxKontextPipeline";
  vae_ = models::load_vae(folder, device_, torch::kFloat32);
  const int64_t latent_channels = vae_->config().latent_channels;
  if (tconfig_.in_channels != 4 * latent_channels)
    throw ConfigError(tconfig_.source + ": in_channels is " + std::to_string(tconfig_.in_channels) +
                      ", but the VAE's " + std::to_string(latent_channels) +
                      " latent channels pack 2x2 into " + std::to_string(4 * latent_channels));
  scheduler_ =
      schedulers::make_scheduler(folder.component_config("scheduler", "scheduler_config.json"));
}

FolderPlanOptions FluxPipeline::plan_options() const {
  return pipeline_plan_options(device_, dtype_, transformer_component_, weight_streaming_,
                               weight_type_, keep_text_encoders_, max_memory_);
}

void FluxPipeline::follow_plan(int64_t width, int64_t height, int64_t reference_images,
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

FluxTextEncoders& FluxPipeline::text_encoders() {
  if (text_) return *text_;
  text_encoder_lora_.reset();
  text_ = std::make_unique<FluxTextEncoders>(folder_, device_, dtype_);
  for (const auto& l : text_encoder_loras_) merge_into_text_encoders(l.part, l.scale);
  return *text_;
}

void FluxPipeline::merge_into_text_encoders(adapters::LoraAdapter part, double scale) {
  if (!text_encoder_lora_)
    text_encoder_lora_ = std::make_unique<adapters::LoraMerger>(
        std::vector<adapters::Network>{{io::lora::text_encoder_names(), text_->clip().get()}});
  text_encoder_lora_->add(std::move(part), scale);
}

namespace {

// Whether the component's safetensors name the blocks as diffusers does: only such weights
// can be viewed where they lie (BFL's names fuse what diffusers' layers split).
bool flux_names_in_files(const io::ModelFolder& folder, const std::string& component) {
  if (models::component_is_gguf(folder, component)) return false;
  for (const auto& [key, tensor] : folder.component_weights(component))
    if (key.rfind("transformer_blocks.", 0) == 0 || key.rfind("single_transformer_blocks.", 0) == 0)
      return true;
  return false;
}

}  // namespace

models::FluxTransformer2DModel& FluxPipeline::transformer() {
  if (transformer_) return transformer_;
  bool stream = weight_streaming_ == "on";
  if (weight_streaming_ == "auto" && !weight_type_ &&
      flux_names_in_files(folder_, transformer_component_)) {
    if (!plan_) plan_ = plan_folder(folder_, plan_options());  // an adapter loads it first
    stream = plan_->stream_denoiser;
  }
  transformer_ = models::load_flux_transformer(folder_, device_, dtype_, transformer_component_,
                                               weight_type_, &quantized_, stream);
  return transformer_;
}

void FluxPipeline::set_weight_type(const std::string& type) {
  const auto parsed = quant::parse_weight_type(type, "weight type");
  check_weight_type_change(type, parsed, weight_type_, static_cast<bool>(transformer_),
                           weight_streaming_);
  weight_type_ = parsed;
}

void FluxPipeline::set_weight_streaming(const std::string& mode) {
  check_weight_streaming_mode(mode, weight_streaming_, static_cast<bool>(transformer_),
                              weight_type_);
  weight_streaming_ = mode;
}

std::string FluxPipeline::add_lora(const std::string& path, double scale,
                                   const adapters::LoraOptions& options) {
  if (!std::isfinite(scale))
    throw InvalidArgument("LoRA '" + path + "': the scale must be a finite number");
  const auto refuse_streaming = [&] {
    throw InvalidArgument("LoRA '" + path +
                          "': a LoRA merges into the transformer's weights, which weight "
                          "streaming reads from their files at every step (--stream-weights off)");
  };
  if (weight_streaming_ == "on") refuse_streaming();  // before loading it to find out
  if (weight_streaming_ == "auto" && !transformer_) weight_streaming_ = "off";
  transformer();  // loaded, and with it what was kept quantized
  if (streams_weights()) refuse_streaming();
  if (quantized_.layers > 0)
    throw InvalidArgument(
        "a LoRA merges into the transformer's plain weights, which quantized "
        "weights (--weights, or a GGUF transformer) give up");
  // Files name the transformer in diffusers' names or in BFL's (kohya's FLUX LoRAs), and
  // CLIP-L as SD's text encoder.
  adapters::Network net{io::lora::transformer_names(), transformer().get()};
  net.file_layout = models::flux_bfl_layout({}, transformer()->config());
  net.module_aliases = models::flux_xlabs_lora_aliases(transformer()->config());
  // CLIP-L's names and shapes resolve the file; without the encoders loaded, a module built
  // from the config alone holds them (its weights are left uninitialised: none is read).
  models::ClipTextModel shapes_only{nullptr};
  torch::nn::Module* clip = nullptr;
  if (text_) {
    clip = text_->clip().get();
  } else {
    nn::SkipInitGuard no_weights(dtype_);
    shapes_only = models::ClipTextModel(models::clip_text_config(folder_, "text_encoder"));
    clip = shapes_only.get();
  }
  auto adapter = adapters::load_lora(path, {net, {io::lora::text_encoder_names(), clip}}, options);
  if (!lora_)
    lora_ = std::make_unique<adapters::LoraMerger>(std::vector<adapters::Network>{std::move(net)});
  auto for_transformer = adapters::select_network(adapter, 0);
  auto for_text = adapters::select_network(adapter, 1);
  const bool text_part = !for_text.pairs.empty() || !for_text.full.empty();
  if (!for_transformer.pairs.empty() || !for_transformer.full.empty())
    lora_->add(std::move(for_transformer), scale);
  if (text_part) {
    text_encoder_loras_.push_back({for_text, scale});
    // Loaded encoders take it now; a later load takes every part (text_encoders()).
    if (text_) merge_into_text_encoders(std::move(for_text), scale);
  }
  return adapters::describe(adapter, path, scale);
}

void FluxPipeline::set_scheduler(std::unique_ptr<schedulers::Scheduler> scheduler) {
  scheduler_ = std::move(scheduler);
}

int64_t FluxPipeline::vae_scale_factor() const {
  return vae_->config().spatial_factor();
}

std::pair<int, int> FluxPipeline::floored_size(int width, int height) const {
  if (width <= 0 || height <= 0 || width > kFluxMaxSide || height > kFluxMaxSide)
    throw InvalidArgument("width and height must be in 1.." + std::to_string(kFluxMaxSide) +
                          ", got " + flux_size_text(width, height));
  const auto m = static_cast<int>(size_multiple());
  const int w = width / m * m, h = height / m * m;
  if (w == 0 || h == 0)
    throw InvalidArgument("a FLUX image needs sides of at least " + std::to_string(m) +
                          " pixels, got " + flux_size_text(width, height));
  return {w, h};
}

std::pair<int64_t, int64_t> FluxPipeline::source_size(int64_t W, int64_t H,
                                                      bool auto_resize) const {
  const int64_t m = size_multiple();
  int64_t w = W / m * m, h = H / m * m;
  if (w == 0 || h == 0)
    throw InvalidArgument("the source image is " + flux_size_text(W, H) +
                          "; each side needs at least " + std::to_string(m) + " pixels");
  if (auto_resize) {
    // Python's min over (|aspect - w/h|, w, h) tuples: ties go to the smaller width, height.
    const double aspect = static_cast<double>(w) / static_cast<double>(h);
    std::tuple<double, int, int> best{INFINITY, 0, 0};
    for (const auto& [rw, rh] : kontext_resolutions())
      best =
          std::min(best, std::make_tuple(std::abs(aspect - static_cast<double>(rw) / rh), rw, rh));
    w = std::get<1>(best) / m * m;
    h = std::get<2>(best) / m * m;
  }
  return {w, h};
}

std::pair<int, int> FluxPipeline::edit_output_size(int width, int height, int64_t max_area) const {
  if (max_area < 0 || max_area > int64_t{kFluxMaxSide} * kFluxMaxSide)
    throw InvalidArgument("max_area must be in 0.." +
                          std::to_string(int64_t{kFluxMaxSide} * kFluxMaxSide) + " pixels, got " +
                          std::to_string(max_area));
  auto [w, h] = floored_size(width, height);
  if (max_area == 0) return {w, h};
  // FluxKontextPipeline: the requested aspect ratio at max_area, Python's round (half to even).
  const double aspect = static_cast<double>(width) / height;
  const auto m = static_cast<int>(size_multiple());
  w = static_cast<int>(std::nearbyint(std::sqrt(static_cast<double>(max_area) * aspect))) / m * m;
  h = static_cast<int>(std::nearbyint(std::sqrt(static_cast<double>(max_area) / aspect))) / m * m;
  if (w == 0 || h == 0 || w > kFluxMaxSide || h > kFluxMaxSide)
    throw InvalidArgument("max_area " + std::to_string(max_area) + " at the aspect ratio of " +
                          flux_size_text(width, height) + " gives " + flux_size_text(w, h) +
                          ", outside 16.." + std::to_string(kFluxMaxSide) + " pixels a side");
  return {w, h};
}

void FluxPipeline::set_sequence_group(std::shared_ptr<parallel::RankGroup> group) {
  if (group) parallel::check_ulysses_group(tconfig_.num_attention_heads, group->size());
  sequence_group_ = std::move(group);
}

void FluxPipeline::check_cache(const DitCacheOptions& cache) const {
  if (cache.method == DitCacheOptions::Method::kOff) return;
  const accel::DitCache check(cache, tconfig_.num_layers, tconfig_.num_single_layers);
  (void)check;  // the constructor checks the block range against this model
}

void FluxPipeline::check_sampling(const FluxSampling& s) const {
  check_cache(s.cache);
  if (s.steps < 1) throw InvalidArgument("steps must be >= 1, got " + std::to_string(s.steps));
  require_finite_scale(s.guidance_scale, "guidance_scale");
  require_finite_scale(s.true_cfg_scale, "true_cfg_scale");
  if (s.max_sequence_length < 1 || s.max_sequence_length > 512)
    throw InvalidArgument("max_sequence_length must be in 1..512 (T5 tokens), got " +
                          std::to_string(s.max_sequence_length));
}

FluxEmbeddings FluxPipeline::encode_prompt(const std::string& prompt, int64_t max_sequence_length) {
  auto e = text_encoders().encode({prompt}, max_sequence_length);
  check_stage_finite(e.t5, "text encoder (T5)", device_, dtype_);
  check_stage_finite(e.pooled, "text encoder (CLIP)", device_, dtype_);
  return e;
}

bool FluxPipeline::encode_prompts(const std::string& prompt,
                                  const std::optional<std::string>& negative, const FluxSampling& s,
                                  FluxResult& out) {
  const double start = flux_clock_s();
  device::reset_peak_memory(device_);
  const bool true_cfg = s.true_cfg_scale > 1.0 && negative.has_value();
  if (s.true_cfg_scale > 1.0 && !negative)
    out.warnings.push_back("true_cfg_scale " + std::to_string(s.true_cfg_scale) +
                           " has no effect without a negative prompt");
  else if (negative && s.true_cfg_scale <= 1.0)
    out.warnings.push_back(
        "the negative prompt has no effect with true_cfg_scale <= 1 (FLUX's guidance is the "
        "guidance embedding; set true_cfg_scale > 1 for a second pass on the negative prompt)");
  out.prompt_embeddings = encode_prompt(prompt, s.max_sequence_length);
  if (out.prompt_embeddings.t5_ids.truncated.at(0))
    out.warnings.push_back("the prompt is longer than " + std::to_string(s.max_sequence_length) +
                           " T5 tokens (max_sequence_length): the rest was cut off");
  if (true_cfg) out.negative_embeddings = encode_prompt(*negative, s.max_sequence_length);
  if (!keep_text_encoders_ || (plan_ && !plan_->keep_text_encoders)) {
    text_encoder_lora_.reset();  // it points into the encoders
    text_.reset();
    device::empty_cache(device_);  // their memory back before the transformer loads
  }
  out.timings.text_encode_s = flux_clock_s() - start;
  record_stage_memory(&out.timings, "text_encode", device_);
  return true_cfg;
}

torch::Tensor FluxPipeline::initial_latents(const FluxSampling& s, int64_t h, int64_t w) const {
  return initial_flow_latents(s.latents, s.seed, tconfig_.in_channels / 4, h, w, device_);
}

void FluxPipeline::prepare_schedule(int steps, int64_t image_tokens) {
  auto* flow = dynamic_cast<schedulers::FlowMatchScheduler*>(scheduler_.get());
  if (flow) {
    flow->set_shift_mu(flow->shift_mu_for(image_tokens));
    flow->set_timesteps_from_sigmas(schedulers::flux_default_sigmas(steps));
    return;
  }
  // Schedulers with sigmas of their own (use_flow_sigmas) get mu and the step count only.
  scheduler_->set_shift_mu(schedulers::calculate_shift(image_tokens));
  scheduler_->set_timesteps(steps);
}

torch::Tensor FluxPipeline::denoise(const FluxSampling& s, torch::Tensor latents, int64_t h,
                                    int64_t w, const torch::Tensor& image_tokens, bool true_cfg,
                                    FluxResult& out, int64_t first_step,
                                    const InpaintLatents* inpaint) {
  const int64_t S = latents.size(1);
  out.img_ids = models::flux_image_ids(h, w);
  if (image_tokens.defined())  // Kontext: the source's tokens sit at frame 1
    out.img_ids = torch::cat({out.img_ids, models::flux_image_ids(out.image_latents.size(2),
                                                                  out.image_latents.size(3), 1.0f)},
                             0);
  const auto& pos = out.prompt_embeddings;
  out.txt_ids = torch::zeros({pos.t5.size(1), 3}, torch::kFloat32);
  if (tconfig_.guidance_embeds) out.guidance = torch::full({1}, s.guidance_scale, torch::kFloat32);
  auto& model = transformer();
  // True CFG runs both prompts as one batch [prompt, negative]: one call per step, which a DiT
  // cache needs (the calls of a step share its decisions).
  auto t5 = pos.t5.to(device_), pooled = pos.pooled.to(device_);
  if (true_cfg) {
    t5 = torch::cat({t5, out.negative_embeddings.t5.to(device_)}, 0);
    pooled = torch::cat({pooled, out.negative_embeddings.pooled.to(device_)}, 0);
  }
  const auto image_side = image_tokens.defined() ? image_tokens.to(device_) : torch::Tensor();
  std::unique_ptr<accel::DitCache> cache;
  if (s.cache.method != DitCacheOptions::Method::kOff)
    cache =
        std::make_unique<accel::DitCache>(s.cache, tconfig_.num_layers, tconfig_.num_single_layers);
  models::FluxForwardOptions fwd;
  fwd.cache = cache.get();
  fwd.sequence_group = sequence_group_.get();

  const double start = flux_clock_s();
  device::reset_peak_memory(device_);
  // Both cores for a real model, one for a tiny one (device/cpu_threads.h).
  const int64_t tokens = S + (image_tokens.defined() ? image_tokens.size(1) : 0) + pos.t5.size(1);
  device::ScopedCpuThreads threads(
      device::threads_for_step_work(plan_ ? denoiser_call_flops(*plan_, tokens) : 0.0));
  device::CpuShareMeter cpu_meter(at::get_num_threads());
  FlowVelocity<FluxStep> velocity = [&](const torch::Tensor& x, const torch::Tensor& t,
                                        FluxStep& step) {
    auto input = image_side.defined() ? torch::cat({x, image_side.to(x.scalar_type())}, 1) : x;
    // diffusers: t.expand(B).to(latents.dtype) / 1000 in the latents' (= the model's) dtype.
    auto ts = t.to(device_, dtype_).reshape({1}) / 1000;
    step.transformer_input = input;
    step.transformer_timestep = ts;
    step.latent_height = h;
    step.latent_width = w;
    if (true_cfg) input = torch::cat({input, input}, 0);
    auto raw = model->forward(input, ts, t5, pooled, out.img_ids, out.txt_ids, out.guidance, fwd)
                   .to(torch::kFloat32);
    step.transformer_out = raw.narrow(0, 0, 1);
    auto v = step.transformer_out.narrow(1, 0, S);
    if (!true_cfg) return v;
    step.transformer_out_negative = raw.narrow(0, 1, 1);
    auto neg = step.transformer_out_negative.narrow(1, 0, S);
    return neg + s.true_cfg_scale * (v - neg);
  };
  FlowDenoiseInputs in;
  in.seed = s.seed;
  in.device = device_;
  in.first_step = first_step;
  in.inpaint = inpaint;
  if (cache) in.begin_step = [&cache](int step, int total) { cache->begin_step(step, total); };
  std::function<StepAction(const FluxStep&)> on_step = s.on_step;
  if (sequence_group_)
    on_step = [&](const FluxStep& st) -> StepAction {
      parallel::check_replicated(*sequence_group_, st.latents,
                                 "latents after step " + std::to_string(st.index + 1));
      return s.on_step ? s.on_step(st) : StepAction(true);
    };
  auto run =
      flow_denoise<FluxStep>(*scheduler_, latents, in, velocity, on_step, out.timings.step_s);
  if (cache) out.cache = cache->stats();
  out.steps_run = run.steps_run;
  out.interrupted = run.interrupted;
  if (run.interrupted) out.warnings.push_back(run.warning);
  out.timings.denoise_s = flux_clock_s() - start;
  out.timings.cpu = cpu_meter.share();
  check_stage_finite(run.latents, "denoising (transformer)", device_, dtype_);
  record_stage_memory(&out.timings, "denoise", device_);
  device::empty_cache(device_);
  auto unpacked = models::flux_unpack(run.latents, h, w);
  out.latents = unpacked.to(torch::kCPU);
  return unpacked;
}

FluxResult FluxPipeline::text_to_image(const FluxTextToImage& r) {
  check_sampling(r.sampling);
  torch::InferenceMode inference;
  const auto [width, height] = floored_size(r.width, r.height);
  FluxResult out;
  if (width != r.width || height != r.height)
    out.warnings.push_back(flux_size_text(r.width, r.height) + " is not a multiple of " +
                           std::to_string(size_multiple()) + " a side; the image is " +
                           flux_size_text(width, height));
  const double start = flux_clock_s();
  follow_plan(width, height, 0, r.sampling.vae_tiling, out.timings);
  const bool true_cfg = encode_prompts(r.prompt, r.negative_prompt, r.sampling, out);
  const int64_t h = height / vae_scale_factor(), w = width / vae_scale_factor();
  auto latents = models::flux_pack(initial_latents(r.sampling, h, w));
  prepare_schedule(r.sampling.steps, latents.size(1));
  auto final_latents = denoise(r.sampling, latents, h, w, {}, true_cfg, out);
  out.image = decode_flow_latents(vae_, final_latents, r.sampling.vae_tiling, device_, out.timings,
                                  out.warnings);
  out.timings.total_s = flux_clock_s() - start;
  return out;
}

namespace {

void check_flux_source(const torch::Tensor& image) {
  if (!image.defined() || image.dim() != 3 || image.size(2) != 3 ||
      image.scalar_type() != torch::kUInt8 || image.size(0) < 1 || image.size(1) < 1)
    throw InvalidArgument("the source image must be uint8 [H, W, 3], got " +
                          (image.defined() ? c10::str(image.sizes()) : std::string("none")));
  if (image.size(0) * image.size(1) > kFluxMaxSourcePixels)
    throw InvalidArgument("the source image is " + flux_size_text(image.size(1), image.size(0)) +
                          "; at most 64 MP are accepted");
}

}  // namespace

void FluxPipeline::encode_source(const torch::Tensor& image, int64_t h, int64_t w,
                                 const VaeTilingOptions& tiling_options, const torch::Tensor& noise,
                                 FluxResult& out) {
  const double start = flux_clock_s();
  // Resized as the reference's VaeImageProcessor resizes a PIL image (a no-op at its size).
  out.source_resized = io::pillow_lanczos_resize(image, h, w);
  auto pixels =
      out.source_resized.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32) / 255.0 * 2 - 1;
  device::reset_peak_memory(device_);
  const auto& vc = vae_->config();
  const auto tiling = choose_vae_tiling(tiling_options, vc, 1, h, w, device_, torch::kFloat32);
  const auto dist = vae_encode(*vae_, pixels.to(device_), tiling.tiling);
  out.image_latents =
      vc.to_latents(noise.defined() ? dist.sample(noise) : dist.mean).to(torch::kFloat32);
  check_stage_finite(out.image_latents, "VAE encoder", device_, torch::kFloat32);
  out.timings.vae_encode_s = flux_clock_s() - start;
  record_stage_memory(&out.timings, "vae_encode", device_);
}

torch::Tensor FluxPipeline::packed_mask(const PreparedInpaint& prepared, int64_t h,
                                        int64_t w) const {
  // FluxInpaintPipeline: the latent mask repeated over the latent channels, then packed.
  const int64_t C = tconfig_.in_channels / 4;
  return models::flux_pack(latent_mask(prepared.mask, h, w).repeat({1, C, 1, 1}));
}

FluxResult FluxPipeline::image_to_image(const FluxImageToImage& r) {
  check_sampling(r.sampling);
  check_flux_source(r.image);
  if (!(r.strength > 0.0 && r.strength <= 1.0))
    throw InvalidArgument("strength must be in (0, 1], got " + std::to_string(r.strength));
  // diffusers' get_timesteps: t_start = int(steps - min(steps * strength, steps)).
  const int N = r.sampling.steps;
  const int first_step =
      static_cast<int>(std::max(N - std::min(N * r.strength, static_cast<double>(N)), 0.0));
  const int64_t H = r.image.size(0), W = r.image.size(1);
  const auto [width, height] = floored_size(r.width > 0 ? r.width : static_cast<int>(W),
                                            r.height > 0 ? r.height : static_cast<int>(H));
  torch::InferenceMode inference;
  std::optional<PreparedInpaint> masked;
  if (r.inpaint.mask.defined()) masked = prepare_inpaint(r.inpaint, r.image, height, width);
  FluxResult out;
  const double start = flux_clock_s();
  follow_plan(width, height, 0, r.sampling.vae_tiling, out.timings);
  const int64_t h = height / vae_scale_factor(), w = width / vae_scale_factor();
  const int64_t C = tconfig_.in_channels / 4;
  // FluxImg2ImgPipeline draws from one CPU generator: the posterior sample, then the noise.
  auto gen = at::detail::createCPUGenerator(r.sampling.seed);
  const auto posterior = torch::randn({1, C, h, w}, gen, torch::kFloat32);
  auto noise = r.sampling.latents.defined() ? initial_latents(r.sampling, h, w)
                                            : torch::randn({1, C, h, w}, gen, torch::kFloat32);
  encode_source(masked ? masked->image : r.image, height, width, r.sampling.vae_tiling, posterior,
                out);
  const bool true_cfg = encode_prompts(r.prompt, r.negative_prompt, r.sampling, out);
  prepare_schedule(r.sampling.steps, (h / 2) * (w / 2));
  const int64_t first = first_step;
  const auto t0 = scheduler_->timesteps()[first].reshape({1});
  auto latents = scheduler_->add_noise(out.image_latents.to(device_), noise.to(device_), t0);
  std::optional<InpaintLatents> ip;
  if (masked) {
    ip.emplace();
    ip->mask = packed_mask(*masked, h, w).to(device_);
    ip->image_latents = models::flux_pack(out.image_latents).to(device_);
    ip->noise = models::flux_pack(noise).to(device_);
  }
  auto final_latents = denoise(r.sampling, models::flux_pack(latents), h, w, {}, true_cfg, out,
                               first, ip ? &*ip : nullptr);
  out.image = decode_flow_latents(vae_, final_latents, r.sampling.vae_tiling, device_, out.timings,
                                  out.warnings);
  if (masked) out.image = finish_inpaint_images(*masked, out.image);
  out.timings.total_s = flux_clock_s() - start;
  out.image_latents = out.image_latents.to(torch::kCPU);
  return out;
}

FluxResult FluxPipeline::edit(const FluxEdit& r) {
  if (!kontext_)
    throw InvalidArgument("this FLUX model (" +
                          folder_.model_index().get<std::string>("_class_name", "") +
                          ") is not an editing model; instruction editing needs FLUX.1 Kontext "
                          "(FluxKontextPipeline)");
  check_sampling(r.sampling);
  torch::InferenceMode inference;
  FluxResult out;
  const double start = flux_clock_s();
  int64_t sw = 0, sh = 0;  // the source's size as encoded
  if (r.image_latents.defined()) {
    const auto& z = r.image_latents;
    const int64_t C = tconfig_.in_channels / 4;
    if (z.dim() != 4 || z.size(0) != 1 || z.size(1) != C || z.size(2) < 2 || z.size(3) < 2 ||
        z.size(2) % 2 != 0 || z.size(3) % 2 != 0)
      throw InvalidArgument("the source's latents must be [1, " + std::to_string(C) +
                            ", h, w] with even h and w, got " + c10::str(z.sizes()));
    check_input_tensor(z, "the source's latents");
    out.image_latents = z.to(device_, torch::kFloat32);
    sh = z.size(2) * vae_scale_factor();
    sw = z.size(3) * vae_scale_factor();
  } else {
    check_flux_source(r.image);
    const int64_t H = r.image.size(0), W = r.image.size(1);
    std::tie(sw, sh) = source_size(W, H, r.auto_resize);
    // The closest training resolution may still be far from an extreme source: say it
    // stretches.
    const double stretch = std::abs(std::log((static_cast<double>(W) / static_cast<double>(H)) /
                                             (static_cast<double>(sw) / static_cast<double>(sh))));
    if (r.auto_resize && stretch > std::log(1.25))
      out.warnings.push_back("the source's aspect ratio (" + flux_size_text(W, H) +
                             ") is far from FLUX Kontext's closest training resolution (" +
                             flux_size_text(sw, sh) +
                             "): it is stretched to it; crop it, or turn auto-resize off to keep "
                             "its shape");
    // Kontext encodes the posterior's mode (the mean).
    encode_source(r.image, sh, sw, r.sampling.vae_tiling, {}, out);
  }
  out.image_latents_packed = models::flux_pack(out.image_latents);

  const auto [width, height] =
      edit_output_size(r.width > 0 ? r.width : static_cast<int>(sw),
                       r.height > 0 ? r.height : static_cast<int>(sh), r.max_area);
  follow_plan(width, height, 1, r.sampling.vae_tiling, out.timings);  // the source's tokens join
  const bool true_cfg = encode_prompts(r.prompt, r.negative_prompt, r.sampling, out);
  const int64_t h = height / vae_scale_factor(), w = width / vae_scale_factor();
  auto latents = models::flux_pack(initial_latents(r.sampling, h, w));
  prepare_schedule(r.sampling.steps, latents.size(1));  // mu from the noisy tokens only
  // A mask keeps the edit inside it: the source at the output's size is blended back outside.
  std::optional<PreparedInpaint> masked;
  std::optional<InpaintLatents> ip;
  if (r.inpaint.mask.defined()) {
    if (r.inpaint.crop_padding >= 0)
      throw InvalidArgument(
          "mask crop (inpaint only masked) is for image-to-image; an edit sees the whole source");
    if (!r.image.defined())
      throw InvalidArgument("a masked edit needs the source image, not only its latents");
    masked = prepare_inpaint(r.inpaint, r.image, height, width);
    FluxResult kept;
    encode_source(masked->image, height, width, r.sampling.vae_tiling, {}, kept);
    ip.emplace();
    ip->mask = packed_mask(*masked, h, w).to(device_);
    ip->image_latents = models::flux_pack(kept.image_latents).to(device_);
    ip->noise = latents.to(device_);
  }
  auto final_latents = denoise(r.sampling, latents, h, w, out.image_latents_packed, true_cfg, out,
                               0, ip ? &*ip : nullptr);
  out.image = decode_flow_latents(vae_, final_latents, r.sampling.vae_tiling, device_, out.timings,
                                  out.warnings);
  if (masked) out.image = finish_inpaint_images(*masked, out.image);
  out.timings.total_s = flux_clock_s() - start;
  out.image_latents = out.image_latents.to(torch::kCPU);
  out.image_latents_packed = out.image_latents_packed.to(torch::kCPU);
  return out;
}

}  // namespace diffuse::pipeline
