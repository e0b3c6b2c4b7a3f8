#include "server/qwenimage_engine.h"

#include <torch/torch.h>

#include <chrono>

#include "adapters/lora.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/flux_transformer.h"  // flux_unpack
#include "nn/attention.h"
#include "pipeline/hidream_variant.h"   // dit_cache_defaults
#include "pipeline/stable_diffusion.h"  // image_to_tensor
#include "server/dit_jobs.h"

namespace diffuse::server {

QwenImageEngine::QwenImageEngine(std::string model_path, const LoadOptions& options,
                                 const std::string& transformer)
    : Engine(std::move(model_path)) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.offload)
    throw InvalidArgument("--offload: not supported for Qwen-Image models by the server");
  if (!options.text_encoder_device.empty() || !options.vae_device.empty())
    throw InvalidArgument(
        "--text-encoder-device/--vae-device: Qwen-Image runs every stage on --device so far");
  device::configure_cpu_threads();
  const auto device = device::resolve_device(options.device);
  device::prepare_device(device);
  const auto dtype = device::resolve_dtype(options.dtype, device, "transformer");
  nn::set_default_attention_backend(
      nn::attention_backend_from_flag_or_env(options.attention, device));
  auto folder = io::ModelFolder::open(this->model_path());
  const auto component = io::use_transformer_weights(folder, transformer);
  cache_defaults_ = pipeline::dit_cache_defaults(folder);
  pipe_ = std::make_unique<pipeline::QwenImagePipeline>(folder, device, dtype, component);
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
  info_.vae_dtype = device::dtype_name(torch::kFloat32);
  info_.attention = nn::attention_backend_name(nn::default_attention_backend());
  info_.scheduler = pipe_->scheduler().class_name();
  info_.prediction_type = "flow";
  info_.default_width = info_.default_height = 1024;
  info_.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ModelDefaults QwenImageEngine::defaults() const {
  ModelDefaults d;
  d.width = info_.default_width;
  d.height = info_.default_height;
  d.size_multiple = static_cast<int>(pipe_->size_multiple());
  d.vae_factor = static_cast<int>(pipe_->vae_scale_factor());
  d.steps = 50;            // QwenImagePipeline's
  d.guidance_scale = 4.0;  // true CFG
  const bool edit = pipe_->is_edit_model();
  d.kinds = edit ? std::vector<JobKind>{JobKind::txt2img, JobKind::edit}
                 : std::vector<JobKind>{JobKind::txt2img};
  const int m = d.size_multiple;
  d.txt2img_size = [m](int w, int h) {
    if (w / m == 0 || h / m == 0)
      throw InvalidArgument("a Qwen-Image picture needs sides of at least " + std::to_string(m) +
                            " pixels");
    return std::pair<int, int>(w / m * m, h / m * m);
  };
  d.edit_size = [](int w, int h, bool) {
    const auto [ew, eh] = pipeline::QwenImagePipeline::edit_source_size(w, h);
    return std::pair<int, int>(static_cast<int>(ew), static_cast<int>(eh));
  };
  d.edit_auto_resize = false;  // the source always goes in at ~1 MP
  d.unet_accelerators = false;
  d.masks = edit;
  d.controlnets = false;
  const pipeline::QwenImagePipeline* pipe = pipe_.get();
  d.check_cache = [pipe](const DitCacheOptions& o) { pipe->check_cache(o); };
  d.cache_defaults = cache_defaults_;
  d.prompt_syntaxes = {"plain"};
  return d;
}

void QwenImageEngine::join_parallel(const parallel::ParallelGroups& groups) {
  if (groups.cfg && groups.sequence)
    throw InvalidArgument(
        "Qwen-Image runs --parallel cfg (2 ranks) or --parallel ulysses, not both at once");
  pipe_->set_cfg_group(groups.cfg);
  pipe_->set_sequence_group(groups.sequence);
}

JobOutput QwenImageEngine::run(const JobRequest& request, JobContext& context) {
  if (request.kind == JobKind::img2img)
    throw InvalidArgument(
        "Qwen-Image models run txt2img (and, Qwen-Image-Edit, edit) jobs, not "
        "img2img");
  const auto& c = request.config;
  return run_dit_images(
      request, context, info_, model_path(), preview_,
      [&](size_t prompt, uint64_t seed, int first_step, int total_steps) {
        pipeline::QwenImageSampling s;
        s.steps = c.steps;
        s.true_cfg_scale = c.guidance_scale;
        s.seed = seed;
        s.cache = c.dit_cache;
        // As the CLI: true CFG on the negative prompt, " " when none is given.
        std::optional<std::string> negative;
        if (const auto& n = negative_prompt_for(c, prompt); !n.empty())
          negative = n;
        else if (s.true_cfg_scale > 1)
          negative = " ";
        s.on_step = [&](const pipeline::QwenImageStep& st) {
          std::string preview;
          if (request.preview)
            preview = encode_png(preview_.project(
                models::flux_unpack(st.denoised, st.latent_height, st.latent_width)));
          return context.step(first_step + st.index + 1, total_steps, std::move(preview));
        };
        pipeline::QwenImageResult r;
        if (request.kind == JobKind::edit) {
          pipeline::QwenImageEdit e;
          e.prompt = c.prompts[prompt];
          e.negative_prompt = negative;
          e.image = pipeline::image_to_tensor(request.init_image);
          e.inpaint = c.inpaint;
          e.sampling = std::move(s);
          r = pipe_->edit(e);
        } else {
          pipeline::QwenImageTextToImage t;
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
