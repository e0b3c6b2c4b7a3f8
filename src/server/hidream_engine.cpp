#include "server/hidream_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "nn/attention.h"
#include "pipeline/hidream_variant.h"
#include "pipeline/stable_diffusion.h"  // image_to_tensor
#include "server/dit_jobs.h"

namespace diffuse::server {
namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

HiDreamEngine::HiDreamEngine(std::string model_path, const LoadOptions& options,
                             const HiDreamEngineOptions& hidream)
    : Engine(std::move(model_path)) {
  const double t0 = now_s();
  if (options.lora_mode != "merged")
    throw InvalidArgument("--lora-mode " + options.lora_mode +
                          ": LoRAs on HiDream's transformer are merged");
  if (options.offload)
    throw InvalidArgument("--offload: not supported for HiDream models by the server");
  device::configure_cpu_threads();
  const auto device = device::resolve_device(options.device);
  device::prepare_device(device);
  const auto dtype = device::resolve_dtype(options.dtype, device, "transformer");
  nn::set_default_attention_backend(
      nn::attention_backend_from_flag_or_env(options.attention, device));
  auto folder = io::ModelFolder::open(this->model_path());
  variant_ = pipeline::hidream_defaults(folder);
  cache_defaults_ = pipeline::dit_cache_defaults(folder);
  const auto transformer = io::use_transformer_weights(folder, hidream.transformer);
  pipe_ = std::make_unique<pipeline::HiDreamPipeline>(
      folder, device, dtype, transformer,
      pipeline::hidream_placement(options.text_encoder_device, options.vae_device, options.dtype));
  pipe_->set_weight_type(options.weights);
  if (!hidream.e1_lora.empty()) {
    adapters::LoraOptions lo;
    lo.alpha = hidream.lora_alpha;
    lo.rank = hidream.lora_rank;
    pipe_->set_editing_lora(hidream.e1_lora, lo);
    has_editing_lora_ = true;
    info_.loras.push_back(hidream.e1_lora + " (HiDream-E1-Full editing LoRA on " +
                          hidream.transformer + ")");
  }
  for (const auto& l : options.loras) {
    adapters::LoraOptions lo;
    lo.lenient = options.lora_lenient;
    info_.loras.push_back(pipe_->add_lora(l.path, l.scale, lo));
  }
  info_.model = this->model_path();
  info_.device = device::device_name(device);
  info_.text_encoder_device = device::device_name(pipe_->text_device());
  info_.vae_device = device::device_name(pipe_->vae_device());
  info_.unet_dtype = device::dtype_name(dtype);
  info_.weights = options.weights;
  info_.text_encoder_dtype = device::dtype_name(pipe_->text_dtype());
  info_.vae_dtype = device::dtype_name(torch::kFloat32);  // the Flux VAE's force_upcast
  info_.attention = nn::attention_backend_name(nn::default_attention_backend());
  info_.scheduler = pipe_->scheduler().class_name();
  info_.prediction_type = "flow";
  info_.default_width = info_.default_height = pipe_->area_side();
  info_.load_s = now_s() - t0;
}

ModelDefaults HiDreamEngine::defaults() const {
  ModelDefaults d;
  d.width = info_.default_width;
  d.height = info_.default_height;
  d.size_multiple = static_cast<int>(pipe_->size_multiple());
  d.vae_factor = static_cast<int>(pipe_->vae_scale_factor());
  d.steps = variant_.steps;  // the variant's reference settings (pipeline/hidream_variant.h)
  d.guidance_scale = variant_.guidance_scale;
  d.image_guidance_scale = variant_.image_guidance_scale;
  // I1 + the E1 LoRA is an editing model: its text-to-image would run on E1's weights.
  d.kinds = has_editing_lora_ ? std::vector<JobKind>{JobKind::edit}
                              : std::vector<JobKind>{JobKind::txt2img, JobKind::edit};
  const pipeline::HiDreamPipeline* pipe = pipe_.get();
  d.txt2img_size = [pipe](int w, int h) { return pipe->normalized_size(w, h, pipe->area_side()); };
  d.edit_size = [pipe](int w, int h, bool /*auto_resize: E1 always scales*/) {
    const auto [ew, eh] = pipe->edit_size(w, h);
    return std::pair<int, int>(static_cast<int>(ew), static_cast<int>(eh));
  };
  d.unet_accelerators = false;
  d.masks = d.supports(JobKind::edit);  // E1 edits stay inside a mask
  d.controlnets = false;                // ControlNets steer UNets
  d.check_cache = [pipe](const DitCacheOptions& o) { pipe->check_cache(o); };
  d.cache_defaults = cache_defaults_;
  d.prompt_syntaxes = {"plain"};  // four text encoders, not one CLIP: prompts go in as written
  return d;
}

pipeline::HiDreamResult HiDreamEngine::run_one(const JobRequest& request, size_t prompt,
                                               uint64_t seed, int first_step, int total_steps,
                                               JobContext& context) {
  const auto& c = request.config;
  pipeline::HiDreamSampling s;
  s.steps = c.steps;
  s.guidance_scale = c.guidance_scale;
  s.seed = seed;
  s.vae_tiling = c.vae_tiling;
  s.cache = c.dit_cache;
  s.on_step = [&](const pipeline::HiDreamStep& st) {
    std::string preview;
    if (request.preview) preview = encode_png(preview_.project(st.denoised));
    return context.step(first_step + st.index + 1, total_steps, std::move(preview));
  };
  const std::string& negative = negative_prompt_for(c, prompt);
  if (request.kind == JobKind::edit) {
    pipeline::HiDreamEdit e;
    e.prompt = c.prompts[prompt];
    e.negative_prompt = negative;
    const auto& im = request.init_image;
    e.image = pipeline::image_to_tensor(im);
    e.image_guidance_scale = request.edit.image_guidance_scale;
    e.clip_cfg_norm = request.edit.clip_cfg_norm;
    e.refine_strength = request.edit.refine_strength;
    e.inpaint = c.inpaint;
    e.sampling = std::move(s);
    return pipe_->edit(e);
  }
  pipeline::HiDreamTextToImage t;
  t.prompt = c.prompts[prompt];
  t.negative_prompt = negative;
  t.width = c.width;
  t.height = c.height;
  t.sampling = std::move(s);
  return pipe_->text_to_image(t);
}

void HiDreamEngine::join_parallel(const parallel::ParallelGroups& groups) {
  pipe_->set_cfg_group(groups.cfg);
  pipe_->set_sequence_group(groups.sequence);
}

JobOutput HiDreamEngine::run(const JobRequest& request, JobContext& context) {
  if (request.kind == JobKind::img2img)
    throw InvalidArgument("HiDream models run txt2img and edit jobs, not img2img");
  return run_dit_images(
      request, context, info_, model_path(), preview_,
      [&](size_t prompt, uint64_t seed, int first_step, int total_steps) {
        auto r = run_one(request, prompt, seed, first_step, total_steps, context);
        return DitImage{r.image, r.latents, r.timings, r.warnings, r.interrupted};
      },
      request.edit.image_guidance_scale);
}

}  // namespace diffuse::server
