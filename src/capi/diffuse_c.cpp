// The C API (include/diffuse/diffuse.h) over the C++ pipelines: every entry point catches
// everything, maps the exception to a status and keeps its message per thread; handles are
// checked against the set of live ones, so a freed or foreign pointer is an error, not a crash.
#include "diffuse/diffuse.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <string>

#include "device/device.h"
#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"
#include "pipeline/stable_diffusion.h"
#include "text/unicode.h"

struct diffuse_pipeline {
  // Stable Diffusion: text-to-image and image-to-image sharing one loaded model.
  std::optional<diffuse::Text2Image> text2image;
  std::optional<diffuse::Image2Image> image2image;
  // HiDream: text-to-image (I1) and instruction edits (E1).
  std::unique_ptr<diffuse::pipeline::HiDreamPipeline> hidream;
  diffuse::pipeline::HiDreamDefaults hidream_defaults;
};

namespace {

using diffuse::InvalidArgument;

thread_local std::string g_error;

// A job the loaded model does not run (an instruction edit on Stable Diffusion).
class Unsupported : public diffuse::Error {
 public:
  using diffuse::Error::Error;
};

std::mutex& live_mutex() {
  static std::mutex m;
  return m;
}
std::set<const diffuse_pipeline*>& live() {
  static std::set<const diffuse_pipeline*> s;
  return s;
}

// A handle the library made and has not freed; InvalidArgument otherwise.
diffuse_pipeline* checked(const diffuse_pipeline* p, const char* call) {
  std::lock_guard<std::mutex> lock(live_mutex());
  if (!p) throw InvalidArgument(std::string(call) + ": the pipeline handle is NULL");
  if (!live().count(p))
    throw InvalidArgument(std::string(call) +
                          ": not a live pipeline handle (freed already, or not made by "
                          "diffuse_pipeline_open)");
  return const_cast<diffuse_pipeline*>(p);
}

// A required or optional UTF-8 string; InvalidArgument naming the field otherwise.
std::string text_field(const char* s, const char* field, bool required) {
  if (!s) {
    if (required) throw InvalidArgument(std::string(field) + ": required, got NULL");
    return {};
  }
  std::string v(s);
  try {
    diffuse::text::utf8_decode(v);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(field) + ": " + e.what());
  }
  return v;
}

diffuse_status fail(diffuse_status status, const std::string& message) {
  g_error = message;
  return status;
}

// Runs `f`, mapping every exception to a status and this thread's message.
template <typename F>
diffuse_status guarded(F&& f) {
  try {
    f();
    g_error.clear();
    return DIFFUSE_OK;
  } catch (const Unsupported& e) {
    return fail(DIFFUSE_ERROR_UNSUPPORTED, e.what());
  } catch (const diffuse::Cancelled& e) {
    return fail(DIFFUSE_ERROR_CANCELLED, e.what());
  } catch (const diffuse::InvalidArgument& e) {
    return fail(DIFFUSE_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const diffuse::IoError& e) {
    return fail(DIFFUSE_ERROR_IO, e.what());
  } catch (const diffuse::FormatError& e) {
    return fail(DIFFUSE_ERROR_FORMAT, e.what());
  } catch (const diffuse::ConfigError& e) {
    return fail(DIFFUSE_ERROR_FORMAT, e.what());
  } catch (const diffuse::DeviceError& e) {
    return fail(DIFFUSE_ERROR_DEVICE, e.what());
  } catch (const std::bad_alloc&) {
    return fail(DIFFUSE_ERROR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    // c10::Error carries a backtrace after its first line.
    std::string what = e.what();
    return fail(DIFFUSE_ERROR_INTERNAL, what.substr(0, what.find('\n')));
  } catch (...) {
    return fail(DIFFUSE_ERROR_INTERNAL, "unknown error");
  }
}

uint64_t pick_seed(int64_t seed) {
  if (seed >= 0) return static_cast<uint64_t>(seed);
  if (seed != -1) throw InvalidArgument("seed: expected >= 0, or -1 for a random one");
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) & ((1ull << 53) - 1);
}

void check_request(const diffuse_request* r, const char* call) {
  if (!r) throw InvalidArgument(std::string(call) + ": the request is NULL");
  if (r->width < 0 || r->height < 0 || r->steps < 0)
    throw InvalidArgument(std::string(call) + ": width, height and steps must be >= 0");
}

diffuse::Image input_image(const diffuse_image* in, const char* call) {
  if (!in) throw InvalidArgument(std::string(call) + ": the input image is NULL");
  constexpr int kMaxSide = 16384;
  if (in->width <= 0 || in->height <= 0 || in->width > kMaxSide || in->height > kMaxSide)
    throw InvalidArgument(std::string(call) + ": the input image is " + std::to_string(in->width) +
                          "x" + std::to_string(in->height) + " (each side 1 to " +
                          std::to_string(kMaxSide) + ")");
  if (!in->rgb) throw InvalidArgument(std::string(call) + ": the input image has no pixels");
  diffuse::Image img;
  img.width = in->width;
  img.height = in->height;
  img.rgb.assign(in->rgb, in->rgb + static_cast<size_t>(in->width) * in->height * 3);
  return img;
}

void set_output(const diffuse::Image& img, uint64_t seed, double seconds, diffuse_image* out) {
  auto* pixels = static_cast<uint8_t*>(std::malloc(img.rgb.size()));
  if (!pixels) throw std::bad_alloc();
  std::memcpy(pixels, img.rgb.data(), img.rgb.size());
  out->width = img.width;
  out->height = img.height;
  out->rgb = pixels;
  out->seed = seed;
  out->seconds = seconds;
}

// The request as a Stable Diffusion generation config.
diffuse::GenerationConfig sd_config(const diffuse_request* r) {
  diffuse::GenerationConfig c;
  c.prompts = {text_field(r->prompt, "prompt", true)};
  if (r->negative_prompt)
    c.negative_prompts = {text_field(r->negative_prompt, "negative_prompt", false)};
  c.width = r->width;
  c.height = r->height;
  if (r->steps > 0) c.steps = r->steps;
  if (r->guidance_scale >= 0) c.guidance_scale = r->guidance_scale;
  if (r->strength >= 0) c.strength = r->strength;
  c.seed = pick_seed(r->seed);
  c.scheduler = text_field(r->scheduler, "scheduler", false);
  return c;
}

diffuse::StepCallback sd_progress(const diffuse_request* r) {
  if (!r->progress) return {};
  const auto fn = r->progress;
  void* user = r->user_data;
  return [fn, user](const diffuse::StepEvent& e) -> diffuse::StepAction {
    return fn(e.step + 1, e.num_steps, user) != 0;
  };
}

diffuse::pipeline::HiDreamSampling hidream_sampling(const diffuse_pipeline* p,
                                                    const diffuse_request* r) {
  diffuse::pipeline::HiDreamSampling s;
  s.steps = r->steps > 0 ? r->steps : p->hidream_defaults.steps;
  s.guidance_scale =
      r->guidance_scale >= 0 ? r->guidance_scale : p->hidream_defaults.guidance_scale;
  s.seed = pick_seed(r->seed);
  if (r->scheduler && *r->scheduler)
    throw InvalidArgument("scheduler: HiDream models run their own flow-matching scheduler here");
  if (r->progress) {
    const auto fn = r->progress;
    void* user = r->user_data;
    const int total = s.steps;
    s.on_step = [fn, user, total](const diffuse::pipeline::HiDreamStep& st) -> diffuse::StepAction {
      return fn(st.index + 1, total, user) != 0;
    };
  }
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_edit(diffuse_pipeline* p, const diffuse_request* r, const diffuse_image* input,
              diffuse_image* out, const char* call) {
  const auto t0 = std::chrono::steady_clock::now();
  diffuse::pipeline::HiDreamEdit e;
  e.prompt = text_field(r->prompt, "prompt", true);
  e.negative_prompt = text_field(r->negative_prompt, "negative_prompt", false);
  const auto img = input_image(input, call);
  e.image = torch::from_blob(const_cast<uint8_t*>(img.rgb.data()), {img.height, img.width, 3},
                             torch::kUInt8)
                .clone();
  e.image_guidance_scale = r->image_guidance_scale >= 0 ? r->image_guidance_scale
                                                        : p->hidream_defaults.image_guidance_scale;
  e.sampling = hidream_sampling(p, r);
  const auto result = p->hidream->edit(e);
  set_output(diffuse::pipeline::to_images(result.image)[0], e.sampling.seed, seconds_since(t0),
             out);
}

void check_out(diffuse_image* out, const char* call) {
  if (!out) throw InvalidArgument(std::string(call) + ": the output image is NULL");
  *out = diffuse_image{};
}

// What every job checks first: a live pipeline, a request, somewhere to put the image.
diffuse_pipeline* begin_job(diffuse_pipeline* pipeline, const diffuse_request* request,
                            diffuse_image* out, const char* call) {
  auto* p = checked(pipeline, call);
  check_request(request, call);
  check_out(out, call);
  return p;
}

}  // namespace

extern "C" {

const char* diffuse_version(void) {
  return DIFFUSE_VERSION;
}

const char* diffuse_last_error(void) {
  return g_error.c_str();
}

diffuse_status diffuse_pipeline_open(const char* model, const char* device, const char* dtype,
                                     diffuse_pipeline** out) {
  return guarded([&] {
    if (!out) throw InvalidArgument("diffuse_pipeline_open: out is NULL");
    *out = nullptr;
    const std::string path = text_field(model, "model", true);
    const std::string dev = device ? text_field(device, "device", false) : "auto";
    const std::string type = dtype ? text_field(dtype, "dtype", false) : "auto";
    auto p = std::make_unique<diffuse_pipeline>();
    if (diffuse::pipeline::is_hidream_folder(path)) {
      const auto folder = diffuse::io::ModelFolder::open(path);
      const auto d = diffuse::device::resolve_device(dev);
      p->hidream = std::make_unique<diffuse::pipeline::HiDreamPipeline>(
          folder, d, diffuse::device::resolve_dtype(type, d, "transformer"));
      p->hidream_defaults = diffuse::pipeline::hidream_defaults(folder);
    } else {
      diffuse::LoadOptions o;
      o.device = dev;
      o.dtype = type;
      p->text2image = diffuse::Text2Image::load(path, o);
      p->image2image = diffuse::Image2Image::sharing(*p->text2image);
    }
    std::lock_guard<std::mutex> lock(live_mutex());
    live().insert(p.get());
    *out = p.release();
  });
}

void diffuse_pipeline_free(diffuse_pipeline* pipeline) {
  if (!pipeline) return;
  {
    std::lock_guard<std::mutex> lock(live_mutex());
    if (!live().erase(pipeline)) return;  // freed already, or not ours
  }
  try {
    delete pipeline;
  } catch (...) {
  }
}

int diffuse_pipeline_can_edit(const diffuse_pipeline* pipeline) {
  std::lock_guard<std::mutex> lock(live_mutex());
  if (!pipeline || !live().count(pipeline)) return -1;
  return pipeline->hidream ? 1 : 0;
}

void diffuse_request_init(diffuse_request* r) {
  if (!r) return;
  *r = diffuse_request{};
  r->guidance_scale = -1;
  r->strength = -1;
  r->image_guidance_scale = -1;
  r->seed = -1;
}

diffuse_status diffuse_txt2img(diffuse_pipeline* pipeline, const diffuse_request* request,
                               diffuse_image* out) {
  return guarded([&] {
    auto* p = begin_job(pipeline, request, out, "diffuse_txt2img");
    const auto t0 = std::chrono::steady_clock::now();
    if (p->hidream) {
      diffuse::pipeline::HiDreamTextToImage t;
      t.prompt = text_field(request->prompt, "prompt", true);
      t.negative_prompt = text_field(request->negative_prompt, "negative_prompt", false);
      t.width = request->width > 0 ? request->width : p->hidream->area_side();
      t.height = request->height > 0 ? request->height : p->hidream->area_side();
      t.sampling = hidream_sampling(p, request);
      const auto result = p->hidream->text_to_image(t);
      set_output(diffuse::pipeline::to_images(result.image)[0], t.sampling.seed, seconds_since(t0),
                 out);
      return;
    }
    const auto config = sd_config(request);
    const auto result = p->text2image->generate(config, sd_progress(request));
    set_output(result.images.at(0), result.seed, seconds_since(t0), out);
  });
}

diffuse_status diffuse_img2img(diffuse_pipeline* pipeline, const diffuse_request* request,
                               const diffuse_image* input, diffuse_image* out) {
  return guarded([&] {
    auto* p = begin_job(pipeline, request, out, "diffuse_img2img");
    if (p->hidream) return run_edit(p, request, input, out, "diffuse_img2img");
    const auto t0 = std::chrono::steady_clock::now();
    const auto config = sd_config(request);
    const auto img = input_image(input, "diffuse_img2img");
    const auto result = p->image2image->generate(config, img, sd_progress(request));
    set_output(result.images.at(0), result.seed, seconds_since(t0), out);
  });
}

diffuse_status diffuse_edit(diffuse_pipeline* pipeline, const diffuse_request* request,
                            const diffuse_image* input, diffuse_image* out) {
  return guarded([&] {
    auto* p = begin_job(pipeline, request, out, "diffuse_edit");
    if (!p->hidream)
      throw Unsupported(
          "diffuse_edit: this model does not edit by instruction (a HiDream-E1 model does); "
          "use diffuse_img2img");
    run_edit(p, request, input, out, "diffuse_edit");
  });
}

void diffuse_image_free(diffuse_image* image) {
  if (!image) return;
  std::free(image->rgb);
  *image = diffuse_image{};
}

diffuse_status diffuse_image_read_png(const char* path, diffuse_image* out) {
  return guarded([&] {
    check_out(out, "diffuse_image_read_png");
    const auto img = diffuse::read_png(text_field(path, "path", true));
    set_output(img, 0, 0, out);
  });
}

diffuse_status diffuse_image_write_png(const diffuse_image* image, const char* path) {
  return guarded([&] {
    const auto img = input_image(image, "diffuse_image_write_png");
    diffuse::write_png(text_field(path, "path", true), img);
  });
}

}  // extern "C"
