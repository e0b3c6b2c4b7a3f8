// The C API (include/diffuse/diffuse.h) over diffuse::Engine: every entry point catches
// everything, maps the exception to a status and keeps its message per thread; handles are
// checked against the set of live ones, so a freed or foreign pointer is an error, not a crash.
#include "diffuse/diffuse.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>

#include "diffuse/engine.h"
#include "diffuse/errors.h"
#include "diffuse/image.h"

struct diffuse_pipeline {
  diffuse::Engine engine;
};

namespace {

using diffuse::InvalidArgument;

thread_local std::string g_error;

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

// A required or optional string; NULL is "absent" (the engine checks the text itself).
std::string text_field(const char* s, const char* field, bool required) {
  if (!s) {
    if (required) throw InvalidArgument(std::string(field) + ": required, got NULL");
    return {};
  }
  return s;
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
  } catch (const diffuse::Unsupported& e) {
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

void check_request(const diffuse_request* r, const char* call) {
  if (!r) throw InvalidArgument(std::string(call) + ": the request is NULL");
}

// The request in the engine's terms: negative numbers mean "the model's default".
diffuse::JobRequest job_request(const diffuse_request* r) {
  diffuse::JobRequest j;
  j.prompt = text_field(r->prompt, "prompt", true);
  j.negative_prompt = text_field(r->negative_prompt, "negative_prompt", false);
  j.scheduler = text_field(r->scheduler, "scheduler", false);
  j.width = r->width;
  j.height = r->height;
  j.steps = r->steps;
  if (std::isnan(r->guidance_scale) || std::isnan(r->strength) ||
      std::isnan(r->image_guidance_scale))
    throw InvalidArgument(
        "guidance_scale, strength, image_guidance_scale: NaN (use -1 for the "
        "model's default)");
  if (r->guidance_scale >= 0) j.guidance_scale = r->guidance_scale;
  if (r->strength >= 0) j.strength = r->strength;
  if (r->image_guidance_scale >= 0) j.image_guidance_scale = r->image_guidance_scale;
  if (r->seed >= 0)
    j.seed = static_cast<uint64_t>(r->seed);
  else if (r->seed != -1)
    throw InvalidArgument("seed: expected >= 0, or -1 for a random one");
  if (r->progress) {
    const auto fn = r->progress;
    void* user = r->user_data;
    j.progress = [fn, user](int step, int total) { return fn(step, total, user) != 0; };
  }
  return j;
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

void set_output(const diffuse::JobResult& r, diffuse_image* out) {
  set_output(r.image, r.seed, r.seconds, out);
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
    auto p = std::make_unique<diffuse_pipeline>(
        diffuse_pipeline{diffuse::Engine::open(path, dev, type)});
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
  return pipeline->engine.can_edit() ? 1 : 0;
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
    set_output(p->engine.txt2img(job_request(request)), out);
  });
}

diffuse_status diffuse_img2img(diffuse_pipeline* pipeline, const diffuse_request* request,
                               const diffuse_image* input, diffuse_image* out) {
  return guarded([&] {
    auto* p = begin_job(pipeline, request, out, "diffuse_img2img");
    const auto img = input_image(input, "diffuse_img2img");
    set_output(p->engine.img2img(job_request(request), img), out);
  });
}

diffuse_status diffuse_edit(diffuse_pipeline* pipeline, const diffuse_request* request,
                            const diffuse_image* input, diffuse_image* out) {
  return guarded([&] {
    auto* p = begin_job(pipeline, request, out, "diffuse_edit");
    const auto img = input_image(input, "diffuse_edit");
    set_output(p->engine.edit(job_request(request), img), out);
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
