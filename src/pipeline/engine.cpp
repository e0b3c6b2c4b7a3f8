// diffuse::Engine (include/diffuse/engine.h): the family of the model decides which pipeline
// runs a job; requests are checked here, once, for every caller (C++, the C API, Python).
#include "diffuse/engine.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <random>

#include "device/device.h"
#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "pipeline/flux.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"
#include "pipeline/qwenimage.h"
#include "pipeline/stable_diffusion.h"
#include "text/unicode.h"

namespace diffuse {

struct Engine::Impl {
  // Stable Diffusion: text-to-image and image-to-image sharing one loaded model.
  std::optional<Text2Image> text2image;
  std::optional<Image2Image> image2image;
  // HiDream: text-to-image (I1) and instruction edits (E1).
  std::unique_ptr<pipeline::HiDreamPipeline> hidream;
  pipeline::HiDreamDefaults hidream_defaults;
  // FLUX.1: text-to-image; FLUX.1 Kontext: also instruction edits.
  std::unique_ptr<pipeline::FluxPipeline> flux;
  // Qwen-Image: text-to-image; Qwen-Image-Edit: also instruction edits.
  std::unique_ptr<pipeline::QwenImagePipeline> qwen;
  bool edits = false;  // a HiDream-E1, FLUX.1 Kontext or Qwen-Image-Edit folder
};

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t pick_seed(const std::optional<uint64_t>& seed) {
  if (seed) return *seed;
  std::random_device rd;
  // 53 bits: exact as a double in JSON and in Python.
  return (static_cast<uint64_t>(rd()) << 32 | rd()) & ((1ull << 53) - 1);
}

// Text fields are UTF-8; InvalidArgument naming the field otherwise.
void check_text(const std::string& s, const char* field, bool required) {
  if (required && s.empty()) throw InvalidArgument(std::string(field) + ": required");
  try {
    text::utf8_decode(s);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(field) + ": " + e.what());
  }
}

void check_request(const JobRequest& r) {
  check_text(r.prompt, "prompt", false);  // empty: unconditional, as diffusers allows
  check_text(r.negative_prompt, "negative_prompt", false);
  check_text(r.scheduler, "scheduler", false);
  if (r.width < 0 || r.height < 0 || r.steps < 0)
    throw InvalidArgument("width, height and steps must be >= 0 (0: the model's default)");
  auto finite = [](const std::optional<double>& value, const char* name) {
    if (value && !std::isfinite(*value))
      throw InvalidArgument(std::string(name) + ": expected a finite number");
  };
  finite(r.guidance_scale, "guidance_scale");
  finite(r.strength, "strength");
  finite(r.image_guidance_scale, "image_guidance_scale");
}

void check_input(const Image& in) {
  constexpr int kMaxSide = 16384;
  if (in.width <= 0 || in.height <= 0 || in.width > kMaxSide || in.height > kMaxSide)
    throw InvalidArgument("the input image is " + std::to_string(in.width) + "x" +
                          std::to_string(in.height) + " (each side 1 to " +
                          std::to_string(kMaxSide) + ")");
  if (in.rgb.size() != static_cast<size_t>(in.width) * in.height * 3)
    throw InvalidArgument("the input image holds " + std::to_string(in.rgb.size()) +
                          " bytes, expected width x height x 3 = " +
                          std::to_string(static_cast<size_t>(in.width) * in.height * 3));
}

GenerationConfig sd_config(const JobRequest& r, uint64_t seed) {
  GenerationConfig c;
  c.prompts = {r.prompt};
  if (!r.negative_prompt.empty()) c.negative_prompts = {r.negative_prompt};
  c.width = r.width;
  c.height = r.height;
  if (r.steps > 0) c.steps = r.steps;
  if (r.guidance_scale) c.guidance_scale = *r.guidance_scale;
  if (r.strength) c.strength = *r.strength;
  c.seed = seed;
  c.scheduler = r.scheduler;
  return c;
}

StepCallback sd_progress(const JobRequest& r) {
  if (!r.progress) return {};
  const auto fn = r.progress;
  return [fn](const StepEvent& e) -> StepAction { return fn(e.step + 1, e.num_steps); };
}

JobResult sd_result(const GenerationResult& g, std::chrono::steady_clock::time_point t0) {
  JobResult out;
  out.image = g.images.at(0);
  out.seed = g.seed;
  out.timings = g.timings;
  out.warnings = g.warnings;
  out.seconds = seconds_since(t0);
  return out;
}

// A HiDream or FLUX result as the engine's job result.
template <typename DitResult>
JobResult dit_result(const DitResult& r, uint64_t seed, std::chrono::steady_clock::time_point t0) {
  JobResult out;
  out.image = pipeline::to_images(r.image).at(0);
  out.seed = seed;
  out.timings = r.timings;
  out.warnings = r.warnings;
  out.seconds = seconds_since(t0);
  return out;
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

Engine Engine::open(const std::string& model, const std::string& device, const std::string& dtype) {
  check_text(model, "model", true);
  check_text(device, "device", false);
  check_text(dtype, "dtype", false);
  const std::string dev = device.empty() ? "auto" : device;
  const std::string type = dtype.empty() ? "auto" : dtype;
  auto impl = std::make_unique<Impl>();
  if (pipeline::is_qwenimage_folder(model)) {
    const auto d = device::resolve_device(dev);
    impl->qwen = std::make_unique<pipeline::QwenImagePipeline>(
        io::ModelFolder::open(model), d, device::resolve_dtype(type, d, "transformer"));
    impl->edits = impl->qwen->is_edit_model();
  } else if (pipeline::is_flux_folder(model)) {
    const auto d = device::resolve_device(dev);
    impl->flux = std::make_unique<pipeline::FluxPipeline>(
        io::ModelFolder::open(model), d, device::resolve_dtype(type, d, "transformer"));
    impl->edits = impl->flux->is_kontext();
  } else if (pipeline::is_hidream_folder(model)) {
    const auto folder = io::ModelFolder::open(model);
    const auto d = device::resolve_device(dev);
    impl->hidream = std::make_unique<pipeline::HiDreamPipeline>(
        folder, d, device::resolve_dtype(type, d, "transformer"));
    impl->hidream_defaults = pipeline::hidream_defaults(folder);
    impl->edits = pipeline::is_hidream_editing_folder(folder);
  } else {
    LoadOptions o;
    o.device = dev;
    o.dtype = type;
    impl->text2image = Text2Image::load(model, o);
    impl->image2image = Image2Image::sharing(*impl->text2image);
  }
  return Engine(std::move(impl));
}

std::string Engine::family() const {
  if (impl_->flux) return "flux";
  if (impl_->qwen) return "qwen-image";
  return impl_->hidream ? "hidream" : "stable-diffusion";
}

bool Engine::can_edit() const {
  return impl_->edits;
}

namespace {

pipeline::HiDreamSampling hidream_sampling(const pipeline::HiDreamDefaults& defaults,
                                           const JobRequest& r, uint64_t seed) {
  pipeline::HiDreamSampling s;
  s.steps = r.steps > 0 ? r.steps : defaults.steps;
  s.guidance_scale = r.guidance_scale.value_or(defaults.guidance_scale);
  s.seed = seed;
  if (!r.scheduler.empty())
    throw InvalidArgument("scheduler: HiDream models run their own flow-matching scheduler here");
  if (r.progress) {
    const auto fn = r.progress;
    const int total = s.steps;
    s.on_step = [fn, total](const pipeline::HiDreamStep& st) -> StepAction {
      return fn(st.index + 1, total);
    };
  }
  return s;
}

// FLUX's reference defaults: 28 steps (schnell, without a guidance embedding: 4), guidance 3.5
// (Kontext 2.5); the negative prompt runs as true CFG at 1.5x when given.
pipeline::FluxSampling flux_sampling(const pipeline::FluxPipeline& flux, const JobRequest& r,
                                     uint64_t seed) {
  if (r.image_guidance_scale)
    throw InvalidArgument("image_guidance_scale: HiDream-E1's; FLUX Kontext has none");
  if (!r.scheduler.empty())
    throw InvalidArgument("scheduler: FLUX models run their own flow-matching scheduler here");
  pipeline::FluxSampling s;
  const bool distilled = flux.transformer_config().guidance_embeds;
  s.steps = r.steps > 0 ? r.steps : (distilled ? 28 : 4);
  s.guidance_scale = r.guidance_scale.value_or(flux.is_kontext() ? 2.5 : 3.5);
  s.max_sequence_length = distilled ? 512 : 256;
  if (!r.negative_prompt.empty()) s.true_cfg_scale = 1.5;
  s.seed = seed;
  if (r.progress) {
    const auto fn = r.progress;
    const int total = s.steps;
    s.on_step = [fn, total](const pipeline::FluxStep& st) -> StepAction {
      return fn(st.index + 1, total);
    };
  }
  return s;
}

// QwenImagePipeline's defaults: 50 steps, true CFG 4 on the negative prompt (" " when none is
// given, as the CLI and the server run it).
pipeline::QwenImageSampling qwen_sampling(const JobRequest& r, uint64_t seed,
                                          std::optional<std::string>* negative) {
  if (r.image_guidance_scale)
    throw InvalidArgument("image_guidance_scale: HiDream-E1's; Qwen-Image-Edit has none");
  if (!r.scheduler.empty())
    throw InvalidArgument("scheduler: Qwen-Image runs its own flow-matching scheduler here");
  pipeline::QwenImageSampling s;
  s.steps = r.steps > 0 ? r.steps : 50;
  s.true_cfg_scale = r.guidance_scale.value_or(4.0);
  s.seed = seed;
  if (!r.negative_prompt.empty())
    *negative = r.negative_prompt;
  else if (s.true_cfg_scale > 1)
    *negative = " ";
  if (r.progress) {
    const auto fn = r.progress;
    const int total = s.steps;
    s.on_step = [fn, total](const pipeline::QwenImageStep& st) -> StepAction {
      return fn(st.index + 1, total);
    };
  }
  return s;
}

std::optional<std::string> negative_or_none(const std::string& negative) {
  if (negative.empty()) return std::nullopt;
  return negative;
}

}  // namespace

JobResult Engine::txt2img(const JobRequest& r) {
  check_request(r);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t seed = pick_seed(r.seed);
  if (impl_->qwen) {
    pipeline::QwenImageTextToImage t;
    t.prompt = r.prompt;
    t.width = r.width > 0 ? r.width : 1024;
    t.height = r.height > 0 ? r.height : 1024;
    t.sampling = qwen_sampling(r, seed, &t.negative_prompt);
    return dit_result(impl_->qwen->text_to_image(t), seed, t0);
  }
  if (impl_->flux) {
    pipeline::FluxTextToImage t;
    t.prompt = r.prompt;
    t.negative_prompt = negative_or_none(r.negative_prompt);
    t.width = r.width > 0 ? r.width : 1024;
    t.height = r.height > 0 ? r.height : 1024;
    t.sampling = flux_sampling(*impl_->flux, r, seed);
    return dit_result(impl_->flux->text_to_image(t), seed, t0);
  }
  if (impl_->hidream) {
    pipeline::HiDreamTextToImage t;
    t.prompt = r.prompt;
    t.negative_prompt = r.negative_prompt;
    t.width = r.width > 0 ? r.width : impl_->hidream->area_side();
    t.height = r.height > 0 ? r.height : impl_->hidream->area_side();
    t.sampling = hidream_sampling(impl_->hidream_defaults, r, seed);
    return dit_result(impl_->hidream->text_to_image(t), seed, t0);
  }
  return sd_result(impl_->text2image->generate(sd_config(r, seed), sd_progress(r)), t0);
}

JobResult Engine::img2img(const JobRequest& r, const Image& input) {
  if (impl_->hidream || impl_->flux || impl_->qwen) return edit(r, input);
  check_request(r);
  check_input(input);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t seed = pick_seed(r.seed);
  return sd_result(impl_->image2image->generate(sd_config(r, seed), input, sd_progress(r)), t0);
}

JobResult Engine::edit(const JobRequest& r, const Image& input) {
  if (impl_->qwen) {
    if (!impl_->edits)
      throw Unsupported(
          "edit: this is a Qwen-Image text-to-image model (a Qwen-Image-Edit folder, "
          "model_index.json QwenImageEditPipeline, edits)");
    check_request(r);
    check_input(input);
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t seed = pick_seed(r.seed);
    pipeline::QwenImageEdit e;
    e.prompt = r.prompt;
    e.image = pipeline::image_to_tensor(input);
    e.width = r.width;
    e.height = r.height;
    e.sampling = qwen_sampling(r, seed, &e.negative_prompt);
    return dit_result(impl_->qwen->edit(e), seed, t0);
  }
  if (impl_->flux) {
    if (!impl_->edits)
      throw Unsupported(
          "edit: this FLUX.1 model was not trained to edit (a FLUX.1 Kontext folder, "
          "model_index.json FluxKontextPipeline, is)");
    check_request(r);
    check_input(input);
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t seed = pick_seed(r.seed);
    pipeline::FluxEdit e;
    e.prompt = r.prompt;
    e.negative_prompt = negative_or_none(r.negative_prompt);
    e.image = pipeline::image_to_tensor(input);
    e.width = r.width;
    e.height = r.height;
    e.max_area = 0;  // the requested (or the resized source's) size as it is
    e.sampling = flux_sampling(*impl_->flux, r, seed);
    return dit_result(impl_->flux->edit(e), seed, t0);
  }
  if (!impl_->hidream)
    throw Unsupported(
        "edit: this model does not edit by instruction (a HiDream-E1 or FLUX.1 Kontext model "
        "does); use image-to-image");
  if (!impl_->edits)
    throw Unsupported(
        "edit: this is a HiDream-I1 model, whose transformer was not trained to edit (a "
        "HiDream-E1 folder, model_index.json HiDreamImageEditingPipeline, is)");
  check_request(r);
  check_input(input);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t seed = pick_seed(r.seed);
  pipeline::HiDreamEdit e;
  e.prompt = r.prompt;
  e.negative_prompt = r.negative_prompt;
  e.image = pipeline::image_to_tensor(input);
  e.image_guidance_scale =
      r.image_guidance_scale.value_or(impl_->hidream_defaults.image_guidance_scale);
  e.sampling = hidream_sampling(impl_->hidream_defaults, r, seed);
  return dit_result(impl_->hidream->edit(e), seed, t0);
}

}  // namespace diffuse
