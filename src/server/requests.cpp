#include "server/requests.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <random>

#include "diffuse/errors.h"
#include "pipeline/stable_diffusion.h"
#include "server/base64.h"
#include "server/json_fields.h"

namespace diffuse::server {
namespace {

constexpr int64_t kMaxSeed = (int64_t{1} << 53);  // exact in a JSON double

uint64_t random_seed() {
  static std::mutex m;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(m);
  return rng() & 0xFFFFFFFFull;  // A1111 draws 32-bit seeds
}

void set_seed(JobRequest& r, std::optional<int64_t> seed) {
  r.config.seed = seed && *seed >= 0 ? static_cast<uint64_t>(*seed) : random_seed();
}

std::string scheduler_list() {
  std::string s;
  for (const auto& n : scheduler_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

void check_scheduler(const std::string& name) {
  const auto names = scheduler_names();
  if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end())
    throw InvalidArgument("scheduler: unknown '" + name +
                          "' (expected one of: " + scheduler_list() + ")");
}

// Sizes, image count and the pipeline's own checks, once every field is read.
void finish(JobRequest& r, const ModelDefaults& model, const ServerLimits& limits) {
  auto& c = r.config;
  if (r.kind == JobKind::img2img) {
    if (r.init_image.empty()) throw InvalidArgument("img2img needs an init image");
    if (c.width == 0) c.width = r.init_image.width / 8 * 8;
    if (c.height == 0) c.height = r.init_image.height / 8 * 8;
  } else {
    if (c.width == 0) c.width = model.width;
    if (c.height == 0) c.height = model.height;
  }
  if (c.width > limits.max_side || c.height > limits.max_side ||
      int64_t{c.width} * c.height > limits.max_pixels)
    throw InvalidArgument("size " + std::to_string(c.width) + "x" + std::to_string(c.height) +
                          " is above this server's limit (sides up to " +
                          std::to_string(limits.max_side) + ", at most " +
                          std::to_string(limits.max_pixels) + " pixels)");
  if (c.width < 8 || c.height < 8 || c.width % 8 || c.height % 8)
    throw InvalidArgument("width and height must be multiples of 8 of at least 8, got " +
                          std::to_string(c.width) + "x" + std::to_string(c.height));
  if (c.steps > limits.max_steps)
    throw InvalidArgument("steps: " + std::to_string(c.steps) +
                          " is above this server's limit of " + std::to_string(limits.max_steps));
  if (r.images() > limits.max_images)
    throw InvalidArgument("the request asks for " + std::to_string(r.images()) +
                          " images, this server's limit per request is " +
                          std::to_string(limits.max_images));
  check_scheduler(c.scheduler);
  pipeline::validate_generation_config(c, r.kind == JobKind::img2img);
}

int to_int(int64_t v) {
  return static_cast<int>(v);
}

}  // namespace

Image decode_image_field(const std::string& base64, const std::string& field,
                         const ServerLimits& limits) {
  return decode_png(base64_decode(base64, field), field,
                    static_cast<uint64_t>(limits.max_upload_pixels));
}

JobRequest parse_native_job(const nlohmann::json& body, const ModelDefaults& model,
                            const ServerLimits& limits) {
  JsonFields f(body);
  JobRequest r;
  r.api = "native";
  auto& c = r.config;
  const size_t n = static_cast<size_t>(limits.max_images);
  auto prompts = f.strings("prompt", n, limits.max_prompt_chars);
  if (!prompts || prompts->empty())
    throw InvalidArgument("prompt: required (a string or an array of strings)");
  c.prompts = *prompts;
  c.negative_prompts =
      f.strings("negative_prompt", n, limits.max_prompt_chars).value_or(std::vector<std::string>{});
  c.width = to_int(f.integer("width", 0, limits.max_side).value_or(0));
  c.height = to_int(f.integer("height", 0, limits.max_side).value_or(0));
  c.steps = to_int(f.integer("steps", 1, limits.max_steps).value_or(25));
  c.guidance_scale = f.number("guidance_scale", 0, 100).value_or(7.5);
  c.scheduler = f.string("scheduler", 64).value_or(model.scheduler);
  c.images_per_prompt = to_int(f.integer("num_images", 1, limits.max_images).value_or(1));
  r.batch_count = to_int(f.integer("batch_count", 1, limits.max_images).value_or(1));
  c.strength = f.number("strength", 0, 1).value_or(0.8);
  c.eta = f.number("eta", 0, 1).value_or(0.0);
  r.preview = f.boolean("preview").value_or(true);
  set_seed(r, f.integer("seed", -1, kMaxSeed));
  const auto mode = f.string("mode", 16);
  const auto init = f.string("init_image", limits.max_body_bytes);
  if (mode && *mode != "txt2img" && *mode != "img2img")
    throw InvalidArgument("mode: expected \"txt2img\" or \"img2img\", got \"" + *mode + "\"");
  r.kind = (mode ? *mode == "img2img" : init.has_value()) ? JobKind::img2img : JobKind::txt2img;
  if (r.kind == JobKind::img2img && !init)
    throw InvalidArgument("init_image: required for img2img (base64 PNG)");
  if (r.kind == JobKind::txt2img && init)
    throw InvalidArgument("init_image: given, but mode is txt2img");
  f.reject_unknown();
  if (init) r.init_image = decode_image_field(*init, "init_image", limits);
  finish(r, model, limits);
  return r;
}

const std::vector<A1111Sampler>& a1111_samplers() {
  static const std::vector<A1111Sampler> samplers = {
      {"Euler a", "euler_a", {"k_euler_a", "k_euler_ancestral"}},
      {"Euler", "euler", {"k_euler"}},
      {"LMS", "lms", {"k_lms"}},
      {"DPM++ 2M", "dpmpp_2m", {"k_dpmpp_2m"}},
      {"DDIM", "ddim", {"ddim"}},
      {"PLMS", "pndm", {"plms", "PNDM"}},
  };
  return samplers;
}

JobRequest parse_a1111(const nlohmann::json& body, bool img2img, const ModelDefaults& model,
                       const ServerLimits& limits, std::vector<std::string>* ignored) {
  JsonFields f(body);
  JobRequest r;
  r.api = "a1111";
  r.kind = img2img ? JobKind::img2img : JobKind::txt2img;
  auto& c = r.config;
  c.prompts = {f.string("prompt", limits.max_prompt_chars).value_or("")};
  const auto neg = f.string("negative_prompt", limits.max_prompt_chars).value_or("");
  if (!neg.empty()) c.negative_prompts = {neg};
  c.steps = to_int(f.integer("steps", 1, limits.max_steps).value_or(50));
  c.guidance_scale = f.number("cfg_scale", 0, 100).value_or(7.0);
  c.width = to_int(f.integer("width", 8, limits.max_side).value_or(0));
  c.height = to_int(f.integer("height", 8, limits.max_side).value_or(0));
  c.images_per_prompt = to_int(f.integer("batch_size", 1, limits.max_images).value_or(1));
  r.batch_count = to_int(f.integer("n_iter", 1, limits.max_images).value_or(1));
  c.eta = f.number("eta", 0, 1).value_or(0.0);
  set_seed(r, f.integer("seed", -1, kMaxSeed));
  // sampler_name, or the older sampler_index (which also holds a name).
  auto sampler = f.string("sampler_name", 64);
  auto index = f.string("sampler_index", 64);
  if (!sampler || sampler->empty()) sampler = index;
  if (sampler && !sampler->empty()) {
    std::string found;
    for (const auto& s : a1111_samplers()) {
      bool match = *sampler == s.name || *sampler == s.scheduler;
      for (const char* a : s.aliases) match = match || *sampler == a;
      if (match) found = s.scheduler;
    }
    if (found.empty()) {
      std::string names;
      for (const auto& s : a1111_samplers())
        names += std::string(names.empty() ? "" : ", ") + s.name;
      throw InvalidArgument("sampler_name: '" + *sampler +
                            "' is not available (available: " + names + ")");
    }
    c.scheduler = found;
  } else {
    c.scheduler = model.scheduler;
  }
  const auto schedule = f.string("scheduler", 64);
  if (schedule && *schedule != "Automatic" && *schedule != "automatic" && !schedule->empty())
    throw InvalidArgument(
        "scheduler: the '" + *schedule +
        "' noise schedule is not supported (only \"Automatic\", the model's own)");
  if (f.boolean("enable_hr").value_or(false))
    throw InvalidArgument("enable_hr: the hires fix is not supported by this server");
  if (img2img) {
    c.strength = f.number("denoising_strength", 0, 1).value_or(0.75);
    const auto* images = body.contains("init_images") ? &body["init_images"] : nullptr;
    f.ignore("init_images");
    if (!images || !images->is_array() || images->empty())
      throw InvalidArgument("init_images: required, an array with one base64 PNG");
    if (images->size() > 1)
      throw InvalidArgument("init_images: only one init image per request is supported");
    if (!(*images)[0].is_string())
      throw InvalidArgument("init_images[0]: expected a base64 string");
    if (f.has("mask")) throw InvalidArgument("mask: inpainting is not supported by this server");
    r.init_image = decode_image_field((*images)[0].get<std::string>(), "init_images[0]", limits);
  }
  for (const auto& k : f.unknown()) {
    f.ignore(k.c_str());
    if (ignored) ignored->push_back(k);
  }
  finish(r, model, limits);
  return r;
}

namespace {

// "WxH" or "auto" (the model's size).
void parse_size(const std::optional<std::string>& size, JobRequest& r) {
  if (!size || *size == "auto") return;
  int w = 0, h = 0;
  char x = 0, extra = 0;
  if (std::sscanf(size->c_str(), "%d%c%d%c", &w, &x, &h, &extra) != 3 || x != 'x' || w <= 0 ||
      h <= 0)
    throw InvalidArgument("size: expected \"WIDTHxHEIGHT\" (e.g. \"512x512\") or \"auto\", got \"" +
                          *size + "\"");
  r.config.width = w;
  r.config.height = h;
}

OpenAiRequest parse_openai_common(JsonFields& f, const ServerLimits& limits) {
  OpenAiRequest o;
  auto& r = o.job;
  r.api = "openai";
  const auto prompt = f.string("prompt", limits.max_prompt_chars);
  if (!prompt || prompt->empty()) throw InvalidArgument("prompt: required");
  r.config.prompts = {*prompt};
  r.config.images_per_prompt = to_int(f.integer("n", 1, limits.max_images).value_or(1));
  parse_size(f.string("size", 32), r);
  o.response_format = f.string("response_format", 16).value_or("b64_json");
  if (o.response_format != "b64_json" && o.response_format != "url")
    throw InvalidArgument("response_format: expected \"b64_json\" or \"url\", got \"" +
                          o.response_format + "\"");
  r.config.steps = 25;
  set_seed(r, f.integer("seed", -1, kMaxSeed));
  // Fields of OpenAI's API that have no meaning for a local model.
  for (const char* k :
       {"model", "quality", "style", "user", "background", "moderation", "output_format"})
    f.ignore(k);
  return o;
}

}  // namespace

OpenAiRequest parse_openai_generation(const nlohmann::json& body, const ModelDefaults& model,
                                      const ServerLimits& limits) {
  JsonFields f(body);
  auto o = parse_openai_common(f, limits);
  o.job.config.scheduler = model.scheduler;
  f.reject_unknown();
  finish(o.job, model, limits);
  return o;
}

OpenAiRequest parse_openai_edit(const nlohmann::json& fields, Image image,
                                const ModelDefaults& model, const ServerLimits& limits) {
  JsonFields f(fields);
  auto o = parse_openai_common(f, limits);
  o.job.kind = JobKind::img2img;
  o.job.config.scheduler = model.scheduler;
  o.job.config.strength = f.number("strength", 0, 1).value_or(0.75);
  o.job.init_image = std::move(image);
  f.reject_unknown();
  finish(o.job, model, limits);
  return o;
}

}  // namespace diffuse::server
