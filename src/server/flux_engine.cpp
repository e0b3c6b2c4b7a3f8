#include "server/flux_engine.h"

#include <torch/torch.h>

#include <chrono>

#include "adapters/lora.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "nn/attention.h"
#include "pipeline/hidream_variant.h"   // dit_cache_defaults
#include "pipeline/stable_diffusion.h"  // image_to_tensor
#include "server/dit_jobs.h"

namespace diffuse::server {

FluxEngine::FluxEngine(std::string model_path, const LoadOptions& options,
                       const std::string& transformer)
    : Engine(std::move(model_path)) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.offload)
    throw InvalidArgument("--offload: not supported for FLUX models by the server");
  if (!options.text_encoder_device.empty() || !options.vae_device.empty())
    throw InvalidArgument(
        "--text-encoder-device/--vae-device: FLUX runs every stage on --device so far");
  device::configure_cpu_threads();
  const auto device = device::resolve_device(options.device);
  device::prepare_device(device);
  const auto dtype = device::resolve_dtype(options.dtype, device, "transformer");
  nn::set_default_attention_backend(
      nn::attention_backend_from_flag_or_env(options.attention, device));
  auto folder = io::ModelFolder::open(this->model_path());
  const auto component = io::use_transformer_weights(folder, transformer);
  cache_defaults_ = pipeline::dit_cache_defaults(folder);
  pipe_ = std::make_unique<pipeline::FluxPipeline>(folder, device, dtype, component);
  pipe_->set_weight_type(options.weights);
  for (const auto& l : options.loras) {
    adapters::LoraOptions lo;
    lo.lenient = options.lora_lenient;
    info_.loras.push_back(pipe_->add_lora(l.path, l.scale, lo));
  }
  info_.model = this->model_path();
  info_.device = info_.text_encoder_device = info_.vae_device = device::device_name(device);
  info_.unet_dtype = info_.text_encoder_dtype = device::dtype_name(dtype);
  info_.weights = options.weights;
  info_.vae_dtype = device::dtype_name(torch::kFloat32);  // force_upcast
  info_.attention = nn::attention_backend_name(nn::default_attention_backend());
  info_.scheduler = pipe_->scheduler().class_name();
  info_.prediction_type = "flow";
  info_.default_width = info_.default_height = 1024;
  info_.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ModelDefaults FluxEngine::defaults() const {
  ModelDefaults d;
  d.width = info_.default_width;
  d.height = info_.default_height;
  d.size_multiple = static_cast<int>(pipe_->size_multiple());
  d.vae_factor = static_cast<int>(pipe_->vae_scale_factor());
  const bool distilled = pipe_->transformer_config().guidance_embeds;
  d.steps = distilled ? 28 : 4;  // the references' (schnell: 4)
  d.guidance_scale = pipe_->is_kontext() ? 2.5 : 3.5;
  d.kinds = pipe_->is_kontext() ? std::vector<JobKind>{JobKind::txt2img, JobKind::edit}
                                : std::vector<JobKind>{JobKind::txt2img};
  const pipeline::FluxPipeline* pipe = pipe_.get();
  d.txt2img_size = [pipe](int w, int h) { return pipe->floored_size(w, h); };
  d.edit_size = [pipe](int w, int h, bool auto_resize) {
    const auto [ew, eh] = pipe->source_size(w, h, auto_resize);
    return std::pair<int, int>(static_cast<int>(ew), static_cast<int>(eh));
  };
  d.edit_auto_resize = pipe_->is_kontext();
  d.unet_accelerators = false;
  d.masks = pipe_->is_kontext();  // Kontext edits stay inside a mask
  d.controlnets = false;          // ControlNets steer UNets
  d.check_cache = [pipe](const DitCacheOptions& o) { pipe->check_cache(o); };
  d.cache_defaults = cache_defaults_;
  d.prompt_syntaxes = {"plain"};  // T5 + CLIP pooled: prompts go in as written
  return d;
}

void FluxEngine::join_parallel(const parallel::ParallelGroups& groups) {
  if (groups.cfg || !groups.sequence)
    throw InvalidArgument("FLUX shares its work over ranks with --parallel ulysses only");
  pipe_->set_sequence_group(groups.sequence);
}

JobOutput FluxEngine::run(const JobRequest& request, JobContext& context) {
  if (request.kind == JobKind::img2img)
    throw InvalidArgument("FLUX models run txt2img (and, Kontext, edit) jobs, not img2img");
  const auto& c = request.config;
  const bool distilled = pipe_->transformer_config().guidance_embeds;
  return run_dit_images(
      request, context, info_, model_path(), preview_,
      [&](size_t prompt, uint64_t seed, int first_step, int total_steps) {
        pipeline::FluxSampling s;
        s.steps = c.steps;
        s.guidance_scale = c.guidance_scale;
        s.max_sequence_length = distilled ? 512 : 256;
        s.seed = seed;
        s.vae_tiling = c.vae_tiling;
        s.cache = c.dit_cache;
        std::optional<std::string> negative;
        if (const auto& n = negative_prompt_for(c, prompt); !n.empty()) {
          negative = n;
          s.true_cfg_scale = 1.5;  // a negative prompt acts only through true CFG
        }
        s.on_step = [&](const pipeline::FluxStep& st) {
          std::string preview;
          if (request.preview)
            preview = encode_png(preview_.project(
                models::flux_unpack(st.denoised, st.latent_height, st.latent_width)));
          return context.step(first_step + st.index + 1, total_steps, std::move(preview));
        };
        pipeline::FluxResult r;
        if (request.kind == JobKind::edit) {
          pipeline::FluxEdit e;
          e.prompt = c.prompts[prompt];
          e.negative_prompt = negative;
          const auto& im = request.init_image;
          e.image = pipeline::image_to_tensor(im);
          e.max_area = 0;
          e.auto_resize = request.edit.auto_resize;
          e.inpaint = c.inpaint;
          e.sampling = std::move(s);
          r = pipe_->edit(e);
        } else {
          pipeline::FluxTextToImage t;
          t.prompt = c.prompts[prompt];
          t.negative_prompt = negative;
          t.width = c.width;
          t.height = c.height;
          t.sampling = std::move(s);
          r = pipe_->text_to_image(t);
        }
        return DitImage{r.image, r.latents, r.timings, r.warnings, r.interrupted};
      });
}

}  // namespace diffuse::server
