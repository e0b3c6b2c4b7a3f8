#include "pipeline/qwenimage.h"

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
#include "io/lora_key_map.h"
#include "io/pillow_resample.h"
#include "models/flux_transformer.h"
#include "models/load_component.h"
#include "models/qwen2_5_vl.h"
#include "parallel/branch_split.h"
#include "parallel/replicated.h"
#include "parallel/ulysses.h"
#include "pipeline/finite_check.h"
#include "pipeline/flow_denoise.h"
#include "pipeline/initial_noise.h"
#include "pipeline/memory_report.h"
#include "pipeline/transformer_streaming.h"
#include "quant/quantized_weight.h"
#include "schedulers/flow_match.h"

namespace diffuse::pipeline {
namespace {

double clock_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string size_text(int64_t w, int64_t h) {
  return std::to_string(w) + "x" + std::to_string(h);
}

constexpr int kMaxSide = 8192;
constexpr int64_t kMaxSourcePixels = int64_t{64} << 20;
// The edit pipeline resizes every source to about this many pixels.
constexpr double kEditSourceArea = 1024.0 * 1024.0;

void check_source(const torch::Tensor& image, int64_t min_side) {
  if (!image.defined() || image.dim() != 3 || image.size(2) != 3 ||
      image.scalar_type() != torch::kUInt8)
    throw InvalidArgument("the source image must be uint8 [H, W, 3], got " +
                          (image.defined() ? c10::str(image.sizes()) : std::string("none")));
  if (image.size(0) < min_side || image.size(1) < min_side)
    throw InvalidArgument("the source image is " + size_text(image.size(1), image.size(0)) +
                          "; each side needs at least " + std::to_string(min_side) +
                          " pixels (one patch of the vision encoder)");
  if (image.size(0) * image.size(1) > kMaxSourcePixels)
    throw InvalidArgument("the source image is " + size_text(image.size(1), image.size(0)) +
                          "; at most 64 MP are accepted");
  const double aspect = static_cast<double>(std::max(image.size(0), image.size(1))) /
                        std::min(image.size(0), image.size(1));
  if (aspect > 200)
    throw InvalidArgument("the source image is " + size_text(image.size(1), image.size(0)) +
                          ": Qwen2.5-VL takes aspect ratios up to 200");
}

}  // namespace

bool is_qwenimage_folder(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path) || !fs::exists(fs::path(path) / "model_index.json")) return false;
  return io::ModelFolder::open(path)
             .model_index()
             .get<std::string>("_class_name", "")
             .rfind("QwenImage", 0) == 0;
}

QwenImagePipeline::QwenImagePipeline(const io::ModelFolder& folder, torch::Device device,
                                     torch::Dtype dtype, const std::string& transformer_component)
    : device_(device),
      dtype_(dtype),
      folder_(folder),
      transformer_component_(transformer_component),
      tconfig_(models::QwenImageTransformerConfig::from_json(
          models::component_config(folder, transformer_component, "QwenImageTransformer2DModel"))) {
  device::configure_cpu_threads();  // the CLI alone left LibTorch at one thread per core
  device::set_cpu_memory_policy();
  const std::string cls = folder.model_index().get<std::string>("_class_name", "");
  // The pipelines this reproduces; the others differ in what they feed the models (EditPlus,
  // Qwen-Image-Edit-2509/2511: several images, each shown to Qwen2.5-VL at 384x384 under its
  // own "Picture N:" template), so they are refused rather than run the wrong way.
  if (cls != "QwenImagePipeline" && cls != "QwenImageEditPipeline" &&
      cls != "QwenImageImg2ImgPipeline" && cls != "QwenImageInpaintPipeline")
    throw ConfigError(folder.dir() + "/model_index.json: pipeline " + cls +
                      " is not supported yet (Qwen-Image runs QwenImagePipeline and "
                      "QwenImageEditPipeline)");
  edit_model_ = cls == "QwenImageEditPipeline";
  for (const char* component : {"text_encoder", "vae", "scheduler"})
    if (!folder.has_component(component))
      throw IoError("Qwen-Image folder '" + folder.dir() + "' has no " + component +
                    "/ (the pipeline needs Qwen2.5-VL, the VAE and the scheduler)");
  text_ = std::make_unique<QwenImageTextEncoder>(folder, device_, dtype_);
  if (edit_model_ && !text_->has_processor())
    throw IoError("Qwen-Image-Edit folder '" + folder.dir() +
                  "' has no processor/preprocessor_config.json: the edit pipeline shows the "
                  "source image to Qwen2.5-VL through the Qwen2-VL image processor");
  if (edit_model_ && !models::qwen2_5_vl_has_vision(folder, "text_encoder"))
    throw ConfigError(folder.component_dir("text_encoder") +
                      ": the text encoder has no vision tower (no vision_config, or no visual.* "
                      "weights): Qwen-Image-Edit needs Qwen2.5-VL's full weights to see the "
                      "source image");
  vae_ = models::load_qwenimage_vae(folder, device_, torch::kFloat32);
  const int64_t z = vae_->config().z_dim;
  if (tconfig_.in_channels != 4 * z)
    throw ConfigError(tconfig_.source + ": in_channels is " + std::to_string(tconfig_.in_channels) +
                      ", but the VAE's " + std::to_string(z) + " latent channels pack 2x2 into " +
                      std::to_string(4 * z));
  scheduler_ =
      schedulers::make_scheduler(folder.component_config("scheduler", "scheduler_config.json"));
}

FolderPlanOptions QwenImagePipeline::plan_options() const {
  return pipeline_plan_options(device_, dtype_, transformer_component_, weight_streaming_,
                               weight_type_, keep_text_encoder_, max_memory_);
}

void QwenImagePipeline::follow_plan(int64_t width, int64_t height, int64_t reference_images,
                                    StageTimings& timings) {
  auto p = plan_generation(folder_, plan_options(), width, height, reference_images, {}, &timings);
  // A transformer with merged adapters stays (reloading would lose them).
  if (p.free_denoiser_for_text && transformer_ && !lora_) {
    transformer_ = nullptr;
    quantized_ = {};
    device::empty_cache(device_);
  }
  plan_ = std::move(p);
}

models::QwenImageTransformer2DModel& QwenImagePipeline::transformer() {
  if (transformer_) return transformer_;
  bool stream = weight_streaming_ == "on";
  if (weight_streaming_ == "auto" && !weight_type_ &&
      !models::component_is_gguf(folder_, transformer_component_)) {
    if (!plan_) plan_ = plan_folder(folder_, plan_options());  // an adapter loads it first
    stream = plan_->stream_denoiser;
  }
  transformer_ = models::load_qwenimage_transformer(
      folder_, device_, dtype_, transformer_component_, weight_type_, &quantized_, stream);
  return transformer_;
}

void QwenImagePipeline::set_weight_type(const std::string& type) {
  const auto parsed = quant::parse_weight_type(type, "weight type");
  check_weight_type_change(type, parsed, weight_type_, static_cast<bool>(transformer_),
                           weight_streaming_);
  weight_type_ = parsed;
}

void QwenImagePipeline::set_weight_streaming(const std::string& mode) {
  check_weight_streaming_mode(mode, weight_streaming_, static_cast<bool>(transformer_),
                              weight_type_);
  weight_streaming_ = mode;
}

std::string QwenImagePipeline::add_lora(const std::string& path, double scale,
                                        const adapters::LoraOptions& options) {
  if (!std::isfinite(scale))
    throw InvalidArgument("LoRA '" + path + "': the scale must be a finite number");
  if (weight_streaming_ == "on")
    throw InvalidArgument("LoRA '" + path +
                          "': a LoRA merges into the transformer's weights, which weight "
                          "streaming reads from their files at every step (--stream-weights off)");
  if (weight_streaming_ == "auto" && !transformer_) weight_streaming_ = "off";
  transformer();
  if (streams_weights())
    throw InvalidArgument("LoRA '" + path + "': the transformer streams its weights");
  if (quantized_.layers > 0)
    throw InvalidArgument(
        "a LoRA merges into the transformer's plain weights, which quantized weights "
        "(--weights, or a GGUF transformer) give up");
  adapters::Network net{io::lora::transformer_names(), transformer().get()};
  auto adapter = adapters::load_lora(path, {net}, options);
  if (!lora_)
    lora_ = std::make_unique<adapters::LoraMerger>(std::vector<adapters::Network>{std::move(net)});
  lora_->add(adapters::select_network(adapter, 0), scale);
  return adapters::describe(adapter, path, scale);
}

void QwenImagePipeline::set_scheduler(std::unique_ptr<schedulers::Scheduler> scheduler) {
  scheduler_ = std::move(scheduler);
}

void QwenImagePipeline::set_sequence_group(std::shared_ptr<parallel::RankGroup> group) {
  if (group) parallel::check_ulysses_group(tconfig_.num_attention_heads, group->size());
  sequence_group_ = std::move(group);
}

void QwenImagePipeline::set_cfg_group(std::shared_ptr<parallel::RankGroup> group) {
  if (group && group->size() != 2)
    throw InvalidArgument("--parallel cfg: Qwen-Image's true CFG has two branches, one per rank: " +
                          std::to_string(group->size()) + " ranks cannot share them");
  cfg_group_ = std::move(group);
}

void QwenImagePipeline::check_cache(const DitCacheOptions& cache) const {
  if (cache.method == DitCacheOptions::Method::kOff) return;
  const accel::DitCache check(cache, tconfig_.num_layers, 0);
  (void)check;
}

void QwenImagePipeline::check_sampling(const QwenImageSampling& s) const {
  check_cache(s.cache);
  if (s.steps < 1) throw InvalidArgument("steps must be >= 1, got " + std::to_string(s.steps));
  if (!std::isfinite(s.true_cfg_scale))
    throw InvalidArgument("true_cfg_scale must be a finite number");
  if (s.max_sequence_length < 1 || s.max_sequence_length > kQwenTokenizerMaxLength)
    throw InvalidArgument("max_sequence_length must be in 1..1024, got " +
                          std::to_string(s.max_sequence_length));
}

std::pair<int64_t, int64_t> QwenImagePipeline::edit_source_size(int64_t width, int64_t height) {
  // calculate_dimensions: Python's round (half to even) of the ~1 MP sides to multiples of 32.
  const double ratio = static_cast<double>(width) / static_cast<double>(height);
  const double w = std::sqrt(kEditSourceArea * ratio);
  const double h = w / ratio;
  return {static_cast<int64_t>(std::nearbyint(w / 32)) * 32,
          static_cast<int64_t>(std::nearbyint(h / 32)) * 32};
}

bool QwenImagePipeline::encode_prompts(const std::string& prompt,
                                       const std::optional<std::string>& negative,
                                       const QwenImageSampling& s, const torch::Tensor& image,
                                       QwenImageResult& out) {
  const double start = clock_s();
  device::reset_peak_memory(device_);
  const bool true_cfg = s.true_cfg_scale > 1.0 && negative.has_value();
  if (s.true_cfg_scale > 1.0 && !negative)
    out.warnings.push_back("true_cfg_scale " + c10::str(s.true_cfg_scale) +
                           " has no effect without a negative prompt");
  const auto& tmpl = image.defined() ? qwen_image_edit_template() : qwen_image_template();
  auto run = [&](const std::string& text, torch::Tensor& ids) {
    auto inputs = image.defined() ? text_->tokenize_edit(text, image) : text_->tokenize(text);
    if (inputs.truncated)
      out.warnings.push_back("the prompt is longer than " +
                             std::to_string(kQwenTokenizerMaxLength) +
                             " tokens: the rest was cut off");
    if (inputs.image) out.image_grid_thw = inputs.image->grid_thw;
    ids = inputs.input_ids;
    auto e = text_->encode(inputs, tmpl.drop);
    // QwenImagePipeline keeps at most max_sequence_length embeddings; the edit pipeline all.
    if (!image.defined() && e.size(1) > s.max_sequence_length)
      e = e.narrow(1, 0, s.max_sequence_length);
    check_stage_finite(e, "text encoder (Qwen2.5-VL)", device_, dtype_);
    return e;
  };
  out.prompt_embeds = run(prompt, out.input_ids);
  if (true_cfg) out.negative_prompt_embeds = run(*negative, out.negative_input_ids);
  if (!keep_text_encoder_ || (plan_ && !plan_->keep_text_encoders)) {
    text_->release();
    device::empty_cache(device_);  // its memory back before the transformer loads
  }
  out.timings.text_encode_s = clock_s() - start;
  record_stage_memory(&out.timings, "text_encode", device_);
  return true_cfg;
}

torch::Tensor QwenImagePipeline::initial_latents(const QwenImageSampling& s, int64_t h,
                                                 int64_t w) const {
  const int64_t C = tconfig_.in_channels / 4;
  if (s.latents.defined() && s.latents.dim() == 3) {
    if (s.latents.size(0) != 1 || s.latents.size(1) != (h / 2) * (w / 2) ||
        s.latents.size(2) != 4 * C)
      throw InvalidArgument("packed initial latents must be [1, " +
                            std::to_string((h / 2) * (w / 2)) + ", " + std::to_string(4 * C) +
                            "], got " + c10::str(s.latents.sizes()));
    check_input_tensor(s.latents, "the initial latents");
    return models::flux_unpack(s.latents.to(torch::kFloat32), h, w).to(device_);
  }
  return initial_flow_latents(s.latents, s.seed, C, h, w, device_);
}

void QwenImagePipeline::prepare_schedule(int steps, int64_t image_tokens) {
  auto* flow = dynamic_cast<schedulers::FlowMatchScheduler*>(scheduler_.get());
  if (flow) {
    flow->set_shift_mu(flow->shift_mu_for(image_tokens));
    flow->set_timesteps_from_sigmas(schedulers::flux_default_sigmas(steps));
    return;
  }
  scheduler_->set_shift_mu(schedulers::calculate_shift(image_tokens));
  scheduler_->set_timesteps(steps);
}

torch::Tensor QwenImagePipeline::denoise(const QwenImageSampling& s, torch::Tensor latents,
                                         int64_t h, int64_t w, const torch::Tensor& source_tokens,
                                         bool true_cfg, QwenImageResult& out,
                                         const InpaintLatents* inpaint) {
  const int64_t S = latents.size(1);
  auto& model = transformer();
  const auto pos = out.prompt_embeds.to(device_);
  const auto neg = true_cfg ? out.negative_prompt_embeds.to(device_) : torch::Tensor();
  const auto source = source_tokens.defined() ? source_tokens.to(device_) : torch::Tensor();
  // The two prompts differ in length, so each has its own call (and DiT cache) per step.
  std::unique_ptr<accel::DitCache> cache, cache_negative;
  if (s.cache.method != DitCacheOptions::Method::kOff) {
    cache = std::make_unique<accel::DitCache>(s.cache, tconfig_.num_layers, 0);
    if (true_cfg)
      cache_negative = std::make_unique<accel::DitCache>(s.cache, tconfig_.num_layers, 0);
  }
  models::QwenImageForwardOptions fwd, fwd_negative;
  fwd.cache = cache.get();
  fwd_negative.cache = cache_negative.get();
  fwd.sequence_group = fwd_negative.sequence_group = sequence_group_.get();

  const double start = clock_s();
  device::reset_peak_memory(device_);
  // Both cores for a real model, one for a tiny one (device/cpu_threads.h).
  const int64_t tokens = latents.size(1) + pos.size(1) + (source.defined() ? source.size(1) : 0);
  device::ScopedCpuThreads threads(
      device::threads_for_step_work(plan_ ? denoiser_call_flops(*plan_, tokens) : 0.0));
  device::CpuShareMeter cpu_meter(at::get_num_threads());
  FlowVelocity<QwenImageStep> velocity = [&](const torch::Tensor& x, const torch::Tensor& t,
                                             QwenImageStep& step) {
    auto input = source.defined() ? torch::cat({x, source.to(x.scalar_type())}, 1) : x;
    // diffusers: t.expand(B).to(latents.dtype) / 1000.
    auto ts = t.to(device_, torch::kFloat32).reshape({1}) / 1000;
    step.transformer_timestep = ts;
    step.latent_height = h;
    step.latent_width = w;
    auto call = [&](const torch::Tensor& text, const models::QwenImageForwardOptions& o) {
      return model->forward(input, ts, text, out.img_shapes, o).to(torch::kFloat32);
    };
    // The edit's source tokens come back too: only the target's are the velocity.
    if (true_cfg && cfg_group_) {
      // One branch per rank; the outputs have the same shape whatever the prompts' lengths.
      parallel::BranchShard shard(*cfg_group_, 2);
      const bool negative = shard.range().first == 1;
      const auto both = shard.gather(negative ? call(neg, fwd_negative) : call(pos, fwd));
      step.transformer_out = both.narrow(0, 0, 1);
      step.transformer_out_negative = both.narrow(0, 1, 1);
    } else {
      step.transformer_out = call(pos, fwd);
      if (true_cfg) step.transformer_out_negative = call(neg, fwd_negative);
    }
    const auto c = step.transformer_out.narrow(1, 0, S);
    if (!true_cfg) return c;
    const auto u = step.transformer_out_negative.narrow(1, 0, S);
    auto comb = u + s.true_cfg_scale * (c - u);
    // Rescaled per token to the conditional prediction's norm (torch.norm over channels).
    return comb * (torch::linalg_vector_norm(c, 2, {-1}, true) /
                   torch::linalg_vector_norm(comb, 2, {-1}, true));
  };
  FlowDenoiseInputs in;
  in.seed = s.seed;
  in.device = device_;
  in.inpaint = inpaint;
  if (cache)
    in.begin_step = [&](int step, int total) {
      cache->begin_step(step, total);
      if (cache_negative) cache_negative->begin_step(step, total);
    };
  std::function<StepAction(const QwenImageStep&)> on_step = s.on_step;
  if (sequence_group_ || cfg_group_)
    on_step = [&](const QwenImageStep& st) -> StepAction {
      const std::string what = "latents after step " + std::to_string(st.index + 1);
      for (auto* g : {sequence_group_.get(), cfg_group_.get()})
        if (g) parallel::check_replicated(*g, st.latents, what);
      return s.on_step ? s.on_step(st) : StepAction(true);
    };
  auto run =
      flow_denoise<QwenImageStep>(*scheduler_, latents, in, velocity, on_step, out.timings.step_s);
  if (cache) out.cache = cache->stats();
  out.steps_run = run.steps_run;
  out.interrupted = run.interrupted;
  if (run.interrupted) out.warnings.push_back(run.warning);
  out.timings.denoise_s = clock_s() - start;
  out.timings.cpu = cpu_meter.share();
  check_stage_finite(run.latents, "denoising (transformer)", device_, dtype_);
  record_stage_memory(&out.timings, "denoise", device_);
  device::empty_cache(device_);
  auto unpacked = models::flux_unpack(run.latents, h, w);
  out.latents = unpacked.to(torch::kCPU);
  return unpacked;
}

torch::Tensor QwenImagePipeline::encode_source(const torch::Tensor& image_resized,
                                               StageTimings& timings) {
  const double start = clock_s();
  device::reset_peak_memory(device_);
  auto pixels = image_resized.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32) / 255.0 * 2 - 1;
  const auto dist = vae_->encode(pixels.to(device_));
  auto latents = vae_->config().to_latents(dist.mean).to(torch::kFloat32);
  check_stage_finite(latents, "VAE encoder", device_, torch::kFloat32);
  timings.vae_encode_s += clock_s() - start;
  record_stage_memory(&timings, "vae_encode", device_);
  return latents;
}

torch::Tensor QwenImagePipeline::decode(const torch::Tensor& latents, QwenImageResult& out) {
  const double start = clock_s();
  device::reset_peak_memory(device_);
  const auto z = vae_->config().from_latents(latents.to(device_, torch::kFloat32));
  auto image =
      (vae_->decode(z) / 2 + 0.5).clamp(0, 1).permute({0, 2, 3, 1}).contiguous().to(torch::kCPU);
  check_stage_finite(image, "VAE decoder", device_, torch::kFloat32);
  out.timings.vae_decode_s = clock_s() - start;
  record_stage_memory(&out.timings, "vae_decode", device_);
  out.timings.peak_rss_bytes = device::memory_stats().peak_rss_bytes;
  return image;
}

QwenImageResult QwenImagePipeline::text_to_image(const QwenImageTextToImage& r) {
  check_sampling(r.sampling);
  if (r.width <= 0 || r.height <= 0 || r.width > kMaxSide || r.height > kMaxSide)
    throw InvalidArgument("width and height must be in 1.." + std::to_string(kMaxSide) + ", got " +
                          size_text(r.width, r.height));
  const auto m = static_cast<int>(size_multiple());
  const int width = r.width / m * m, height = r.height / m * m;
  if (width == 0 || height == 0)
    throw InvalidArgument("a Qwen-Image picture needs sides of at least " + std::to_string(m) +
                          " pixels, got " + size_text(r.width, r.height));
  torch::InferenceMode inference;
  prepare_schedule(r.sampling.steps, 1);  // a schedule the scheduler refuses fails before loading
  QwenImageResult out;
  if (width != r.width || height != r.height)
    out.warnings.push_back(size_text(r.width, r.height) + " is not a multiple of " +
                           std::to_string(m) + " a side; the image is " + size_text(width, height));
  const double start = clock_s();
  follow_plan(width, height, 0, out.timings);
  const bool true_cfg = encode_prompts(r.prompt, r.negative_prompt, r.sampling, {}, out);
  const int64_t h = height / vae_scale_factor(), w = width / vae_scale_factor();
  out.img_shapes = {{1, h / 2, w / 2}};
  auto latents = models::flux_pack(initial_latents(r.sampling, h, w));
  prepare_schedule(r.sampling.steps, latents.size(1));
  auto final_latents = denoise(r.sampling, latents, h, w, {}, true_cfg, out);
  out.image = decode(final_latents, out);
  out.timings.total_s = clock_s() - start;
  out.prompt_embeds = out.prompt_embeds.to(torch::kCPU);
  if (true_cfg) out.negative_prompt_embeds = out.negative_prompt_embeds.to(torch::kCPU);
  return out;
}

QwenImageResult QwenImagePipeline::edit(const QwenImageEdit& r) {
  if (!edit_model_)
    throw InvalidArgument("this Qwen-Image model (" +
                          folder_.model_index().get<std::string>("_class_name", "") +
                          ") is a text-to-image model; instruction editing needs "
                          "Qwen-Image-Edit (QwenImageEditPipeline)");
  check_sampling(r.sampling);
  check_source(r.image, 14);
  torch::InferenceMode inference;
  prepare_schedule(r.sampling.steps, 1);  // a schedule the scheduler refuses fails before loading
  QwenImageResult out;
  const double start = clock_s();
  const auto [sw, sh] = edit_source_size(r.image.size(1), r.image.size(0));
  if (sw < size_multiple() || sh < size_multiple() || sw > kMaxSide || sh > kMaxSide)
    throw InvalidArgument(
        "the source's aspect ratio (" + size_text(r.image.size(1), r.image.size(0)) + ") gives " +
        size_text(sw, sh) + " at one megapixel, outside " + std::to_string(size_multiple()) + ".." +
        std::to_string(kMaxSide) + " pixels a side");
  const auto m = size_multiple();
  const int64_t width = (r.width > 0 ? r.width : sw) / m * m;
  const int64_t height = (r.height > 0 ? r.height : sh) / m * m;
  if (width == 0 || height == 0 || width > kMaxSide || height > kMaxSide)
    throw InvalidArgument("the output must be " + std::to_string(m) + ".." +
                          std::to_string(kMaxSide) + " pixels a side, got " +
                          size_text(r.width, r.height));
  follow_plan(width, height, 1, out.timings);  // the source's tokens join the sequence
  // VaeImageProcessor.resize: Pillow's Lanczos to the ~1 MP size, for Qwen2.5-VL and the VAE.
  out.source_resized = io::pillow_lanczos_resize(r.image, sh, sw);
  const bool true_cfg =
      encode_prompts(r.prompt, r.negative_prompt, r.sampling, out.source_resized, out);
  auto source_latents = encode_source(out.source_resized, out.timings);
  out.image_latents_packed = models::flux_pack(source_latents);
  const int64_t h = height / vae_scale_factor(), w = width / vae_scale_factor();
  out.img_shapes = {{1, h / 2, w / 2}, {1, source_latents.size(2) / 2, source_latents.size(3) / 2}};
  auto latents = models::flux_pack(initial_latents(r.sampling, h, w));
  prepare_schedule(r.sampling.steps, latents.size(1));  // mu from the noisy tokens only
  std::optional<PreparedInpaint> masked;
  std::optional<InpaintLatents> ip;
  if (r.inpaint.mask.defined()) {
    if (r.inpaint.crop_padding >= 0)
      throw InvalidArgument(
          "mask crop (inpaint only masked) is for image-to-image; an edit "
          "sees the whole source");
    masked = prepare_inpaint(r.inpaint, r.image, height, width);
    auto kept = encode_source(io::pillow_lanczos_resize(masked->image, height, width), out.timings);
    ip.emplace();
    const int64_t C = tconfig_.in_channels / 4;
    ip->mask = models::flux_pack(latent_mask(masked->mask, h, w).repeat({1, C, 1, 1})).to(device_);
    ip->image_latents = models::flux_pack(kept).to(device_);
    ip->noise = latents.to(device_);
  }
  auto final_latents = denoise(r.sampling, latents, h, w, out.image_latents_packed, true_cfg, out,
                               ip ? &*ip : nullptr);
  out.image = decode(final_latents, out);
  if (masked) out.image = finish_inpaint_images(*masked, out.image);
  out.timings.total_s = clock_s() - start;
  out.prompt_embeds = out.prompt_embeds.to(torch::kCPU);
  if (true_cfg) out.negative_prompt_embeds = out.negative_prompt_embeds.to(torch::kCPU);
  out.image_latents_packed = out.image_latents_packed.to(torch::kCPU);
  return out;
}

}  // namespace diffuse::pipeline
