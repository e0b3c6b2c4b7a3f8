#include "server/requests.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <random>
#include <tuple>

#include "accel/dit_cache.h"
#include "diffuse/errors.h"
#include "pipeline/prompt_loras.h"
#include "pipeline/stable_diffusion.h"
#include "pipeline/vae_tiling_policy.h"
#include "server/base64.h"
#include "server/json_fields.h"
#include "server/request_conditions.h"

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

void check_scheduler(const std::string& name, const std::vector<std::string>& names) {
  if (name.empty() || std::find(names.begin(), names.end(), name) != names.end()) return;
  if (names.empty())
    throw InvalidArgument("scheduler: this model runs only its own scheduler; leave '" + name +
                          "' out");
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  throw InvalidArgument("scheduler: unknown '" + name + "' (expected one of: " + list + ")");
}

// Sizes, image count and the pipeline's own checks, once every field is read.
void finish(JobRequest& r, const ModelDefaults& model, const ServerLimits& limits) {
  auto& c = r.config;
  if (!model.supports(r.kind))
    throw InvalidArgument(std::string("this model does not run ") + to_string(r.kind) +
                          " jobs (it runs: " + model.kinds_text() + ")");
  if (r.kind != JobKind::txt2img && r.init_image.empty())
    throw InvalidArgument(std::string(to_string(r.kind)) + " needs an init image");
  const int m = std::max(1, model.size_multiple);
  if (r.kind == JobKind::edit) {
    // The edit pipeline scales the source to the model's area itself.
    if (c.width != 0 || c.height != 0)
      throw InvalidArgument(
          "width/height (size): an edit keeps the source image's aspect ratio at the model's "
          "area; leave them out");
    if (model.edit_size) {
      std::tie(c.width, c.height) =
          model.edit_size(r.init_image.width, r.init_image.height, r.edit.auto_resize);
    } else {
      c.width = r.init_image.width / m * m;
      c.height = r.init_image.height / m * m;
    }
  } else if (r.kind == JobKind::img2img) {
    if ((c.width == 0 && r.init_image.width < m) || (c.height == 0 && r.init_image.height < m))
      throw InvalidArgument("the init image is " + std::to_string(r.init_image.width) + "x" +
                            std::to_string(r.init_image.height) +
                            " pixels: each side needs at least " + std::to_string(m) +
                            " for this model (or give width and height)");
    if (c.width == 0) c.width = r.init_image.width / m * m;
    if (c.height == 0) c.height = r.init_image.height / m * m;
  } else {
    if (c.width == 0) c.width = model.width;
    if (c.height == 0) c.height = model.height;
  }
  // The size made: a HiDream txt2img request's width x height is only its aspect ratio.
  const bool aspect_only = r.kind == JobKind::txt2img && model.txt2img_size;
  int made_w = c.width, made_h = c.height;
  if (aspect_only) {
    if (c.width < 1 || c.height < 1)
      throw InvalidArgument("width and height must be positive, got " + std::to_string(c.width) +
                            "x" + std::to_string(c.height));
    std::tie(made_w, made_h) = model.txt2img_size(c.width, c.height);
  }
  if (made_w > limits.max_side || made_h > limits.max_side ||
      int64_t{made_w} * made_h > limits.max_pixels)
    throw InvalidArgument("size " + std::to_string(made_w) + "x" + std::to_string(made_h) +
                          " is above this server's limit (sides up to " +
                          std::to_string(limits.max_side) + ", at most " +
                          std::to_string(limits.max_pixels) + " pixels)");
  if (!aspect_only && (c.width < m || c.height < m || c.width % m || c.height % m))
    throw InvalidArgument("width and height must be multiples of " + std::to_string(m) +
                          " of at least " + std::to_string(m) + " for this model, got " +
                          std::to_string(c.width) + "x" + std::to_string(c.height) +
                          (r.kind == JobKind::txt2img ? "" : " (from the init image's size)"));
  const int f = std::max(1, model.vae_factor);
  if (c.vae_tiling.tile_size != 0 && (c.vae_tiling.tile_size < 2 * f || c.vae_tiling.tile_size % f))
    throw InvalidArgument("vae_tile_size: expected a multiple of " + std::to_string(f) +
                          " of at least " + std::to_string(2 * f) +
                          " pixels for this model's VAE (or 0: its own), got " +
                          std::to_string(c.vae_tiling.tile_size));
  if (c.steps > limits.max_steps)
    throw InvalidArgument("steps: " + std::to_string(c.steps) +
                          " is above this server's limit of " + std::to_string(limits.max_steps));
  if (r.images() > limits.max_images)
    throw InvalidArgument("the request asks for " + std::to_string(r.images()) +
                          " images, this server's limit per request is " +
                          std::to_string(limits.max_images));
  check_scheduler(c.scheduler, model.schedulers);
  if (std::find(model.prompt_syntaxes.begin(), model.prompt_syntaxes.end(), c.prompt_syntax) ==
      model.prompt_syntaxes.end()) {
    std::string list;
    for (const auto& p : model.prompt_syntaxes) list += (list.empty() ? "" : ", ") + p;
    throw InvalidArgument("prompt_syntax: '" + c.prompt_syntax +
                          "' is not available for this model (available: " + list + ")");
  }
  // The adapters a prompt names are swapped in for this job only (hot swap, no reload).
  if (c.prompt_syntax == "a1111") {
    try {
      c.loras = pipeline::take_prompt_loras(c, model.lora_dir);
    } catch (const IoError& e) {  // a name that is not in the folder: the client's mistake
      throw InvalidArgument(e.what());
    }
  }
  pipeline::validate_generation_config(c, r.kind == JobKind::img2img,
                                       r.kind == JobKind::txt2img && model.txt2img_size ? 1 : m);
  if (r.kind == JobKind::edit && !(r.edit.image_guidance_scale >= 0))
    throw InvalidArgument("image_guidance_scale must be >= 0");
}

int to_int(int64_t v) {
  return static_cast<int>(v);
}

}  // namespace

bool ModelDefaults::supports(JobKind kind) const {
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

std::string ModelDefaults::kinds_text() const {
  std::string s;
  for (auto k : kinds) s += std::string(s.empty() ? "" : ", ") + to_string(k);
  return s;
}

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
  c.steps = to_int(f.integer("steps", 1, limits.max_steps).value_or(model.steps));
  c.guidance_scale = f.number("guidance_scale", 0, 100).value_or(model.guidance_scale);
  c.scheduler = f.string("scheduler", 64).value_or(model.scheduler);
  c.prompt_syntax = f.string("prompt_syntax", 16).value_or(model.prompt_syntaxes.front());
  c.images_per_prompt = to_int(f.integer("num_images", 1, limits.max_images).value_or(1));
  r.batch_count = to_int(f.integer("batch_count", 1, limits.max_images).value_or(1));
  c.strength = f.number("strength", 0, 1).value_or(0.8);
  c.eta = f.number("eta", 0, 1).value_or(0.0);
  r.preview = f.boolean("preview").value_or(true);
  set_seed(r, f.integer("seed", -1, kMaxSeed));
  for (const char* k : {"deepcache", "deepcache_layer", "deepcache_block", "deepcache_schedule",
                        "tome", "tome_policy"})
    if (f.has(k) && !model.unet_accelerators)
      throw InvalidArgument(std::string(k) + ": this model has no UNet to accelerate");
  c.deep_cache.interval = to_int(f.integer("deepcache", 1, 1000).value_or(1));
  c.deep_cache.layer_id = to_int(f.integer("deepcache_layer", 0, 64).value_or(0));
  c.deep_cache.block_id = to_int(f.integer("deepcache_block", 0, 64).value_or(0));
  const auto schedule = f.string("deepcache_schedule", 16).value_or("uniform");
  if (schedule != "uniform" && schedule != "non-uniform")
    throw InvalidArgument("deepcache_schedule: expected \"uniform\" or \"non-uniform\", got \"" +
                          schedule + "\"");
  c.deep_cache.non_uniform = schedule == "non-uniform";
  c.token_merging.ratio = f.number("tome", 0, 1).value_or(0.0);
  const auto tome_policy = f.string("tome_policy", 16).value_or("auto");
  if (tome_policy != "auto" && tome_policy != "always")
    throw InvalidArgument("tome_policy: expected \"auto\" or \"always\", got \"" + tome_policy +
                          "\"");
  c.token_merging.always = tome_policy == "always";
  auto cache = f.string("cache", 64).value_or("off");
  if (const auto it = model.cache_defaults.find(cache); it != model.cache_defaults.end())
    cache = it->second;  // the model folder's measured setting for a bare method name
  c.dit_cache = accel::parse_dit_cache(cache, "cache");
  if (model.unet_accelerators) accel::refuse_dit_cache_on_unet(c.dit_cache, "cache");
  if (model.check_cache) model.check_cache(c.dit_cache);
  c.vae_tiling.mode = f.string("vae_tiling", 8).value_or("auto");
  c.vae_tiling.tile_size = to_int(f.integer("vae_tile_size", 0, limits.max_side).value_or(0));
  pipeline::validate_vae_tiling_options(c.vae_tiling);
  const auto mode = f.string("mode", 16);
  const auto init = f.string("init_image", limits.max_body_bytes);
  if (mode) {
    const auto kind = job_kind_from_string(*mode);
    if (!kind)
      throw InvalidArgument("mode: expected \"txt2img\", \"img2img\" or \"edit\", got \"" + *mode +
                            "\"");
    r.kind = *kind;
  } else if (init) {
    // An image without a mode: whatever this model does with one.
    r.kind = model.supports(JobKind::img2img) ? JobKind::img2img : JobKind::edit;
  }
  if (r.kind != JobKind::txt2img && !init)
    throw InvalidArgument(std::string("init_image: required for ") + to_string(r.kind) +
                          " (base64 PNG)");
  if (r.kind == JobKind::txt2img && init)
    throw InvalidArgument("init_image: given, but mode is txt2img");
  r.edit.image_guidance_scale =
      f.number("image_guidance_scale", 0, 100).value_or(model.image_guidance_scale);
  r.edit.clip_cfg_norm = f.boolean("clip_cfg_norm").value_or(true);
  r.edit.refine_strength = f.number("refine_strength", 0, 1).value_or(0.0);
  r.edit.auto_resize = f.boolean("auto_resize").value_or(true);
  if (r.kind != JobKind::edit)
    for (const char* k :
         {"image_guidance_scale", "clip_cfg_norm", "refine_strength", "auto_resize"})
      if (f.has(k)) throw InvalidArgument(std::string(k) + ": only for edit jobs");
  if (f.has("auto_resize") && !model.edit_auto_resize)
    throw InvalidArgument(
        "auto_resize: only for FLUX Kontext edits (this model scales every source to its area)");
  read_native_conditions(f, body, r, model, limits);
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

std::vector<A1111Sampler> a1111_samplers(const ModelDefaults& model) {
  std::vector<A1111Sampler> out;
  for (const auto& s : a1111_samplers())
    if (std::find(model.schedulers.begin(), model.schedulers.end(), s.scheduler) !=
        model.schedulers.end())
      out.push_back(s);
  return out;
}

JobRequest parse_a1111(const nlohmann::json& body, bool img2img, const ModelDefaults& model,
                       const ServerLimits& limits, std::vector<std::string>* ignored) {
  JsonFields f(body);
  JobRequest r;
  r.api = "a1111";
  r.kind = img2img ? JobKind::img2img : JobKind::txt2img;
  auto& c = r.config;
  c.prompt_syntax = model.prompt_syntaxes.front();  // A1111 clients write A1111 prompts
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
    const auto available = a1111_samplers(model);
    for (const auto& s : available) {
      bool match = *sampler == s.name || *sampler == s.scheduler;
      for (const char* a : s.aliases) match = match || *sampler == a;
      if (match) found = s.scheduler;
    }
    if (found.empty()) {
      std::string names;
      for (const auto& s : available) names += std::string(names.empty() ? "" : ", ") + s.name;
      throw InvalidArgument("sampler_name: '" + *sampler + "' is not available (" +
                            (names.empty() ? "this model runs only its own scheduler: leave "
                                             "sampler_name out"
                                           : "available: " + names) +
                            ")");
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
  // In txt2img it is the hires fix's (refused above), but a value no API takes is still an error.
  const auto strength = f.number("denoising_strength", 0, 1);
  if (img2img) {
    c.strength = strength.value_or(0.75);
    const auto* images = body.contains("init_images") ? &body["init_images"] : nullptr;
    f.ignore("init_images");
    if (!images || !images->is_array() || images->empty())
      throw InvalidArgument("init_images: required, an array with one base64 PNG");
    if (images->size() > 1)
      throw InvalidArgument("init_images: only one init image per request is supported");
    if (!(*images)[0].is_string())
      throw InvalidArgument("init_images[0]: expected a base64 string");
    r.init_image = decode_image_field((*images)[0].get<std::string>(), "init_images[0]", limits);
  }
  read_a1111_conditions(f, body, r, model, limits);
  for (const auto& k : f.unknown()) {
    f.ignore(k.c_str());
    if (ignored) ignored->push_back(k);
  }
  finish(r, model, limits);
  return r;
}

namespace {

// A string field that must be one of `allowed` (absent: nullopt).
std::optional<std::string> one_of(JsonFields& f, const char* name,
                                  std::initializer_list<const char*> allowed) {
  auto v = f.string(name, 64);
  if (!v) return v;
  std::string names;
  for (const char* a : allowed) {
    if (*v == a) return v;
    names += std::string(names.empty() ? "" : ", ") + "\"" + a + "\"";
  }
  throw InvalidArgument(std::string(name) + ": expected one of " + names + ", got \"" + *v + "\"");
}

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

OpenAiRequest parse_openai_common(JsonFields& f, const ModelDefaults& model,
                                  const ServerLimits& limits) {
  OpenAiRequest o;
  auto& r = o.job;
  r.api = "openai";
  r.config.steps = model.steps;
  r.config.guidance_scale = model.guidance_scale;
  const auto prompt = f.string("prompt", limits.max_prompt_chars);
  if (!prompt || prompt->empty()) throw InvalidArgument("prompt: required");
  r.config.prompts = {*prompt};
  r.config.images_per_prompt = to_int(f.integer("n", 1, limits.max_images).value_or(1));
  parse_size(f.string("size", 32), r);
  o.response_format = f.string("response_format", 16).value_or("b64_json");
  if (o.response_format != "b64_json" && o.response_format != "url")
    throw InvalidArgument("response_format: expected \"b64_json\" or \"url\", got \"" +
                          o.response_format + "\"");
  set_seed(r, f.integer("seed", -1, kMaxSeed));
  o.output_format = one_of(f, "output_format", {"png", "jpeg", "webp"}).value_or("png");
  o.output_compression =
      to_int(f.integer("output_compression", 0, 100).value_or(o.output_compression));
  if (o.output_format != "png" && o.response_format == "url")
    throw InvalidArgument("output_format: \"" + o.output_format +
                          "\" is given as b64_json only (image urls serve PNG files)");
  if (const auto m = f.string("model", 256); m && !m->empty() && *m != model.name) {
    const auto& aliases = openai_model_aliases();
    if (std::find(aliases.begin(), aliases.end(), *m) == aliases.end()) {
      std::string names;
      for (const auto& a : aliases) names += ", \"" + a + "\"";
      throw InvalidArgument("model: \"" + *m + "\" is not served here; this server serves \"" +
                            model.name + "\" (also answering to" + names.substr(1) + ")");
    }
  }
  // Values OpenAI defines that change nothing for a local model, and one it cannot honour.
  one_of(f, "quality", {"auto", "high", "medium", "low", "standard", "hd"});
  one_of(f, "style", {"vivid", "natural"});
  one_of(f, "moderation", {"auto", "low"});
  if (one_of(f, "background", {"auto", "opaque", "transparent"}).value_or("") == "transparent")
    throw InvalidArgument(
        "background: \"transparent\" is not supported: the model draws opaque images (use "
        "\"opaque\" or \"auto\")");
  f.string("user", 256);
  return o;
}

}  // namespace

const std::vector<std::string>& openai_model_aliases() {
  static const std::vector<std::string> names = {"dall-e-2", "dall-e-3", "gpt-image-1",
                                                 "gpt-image-1-mini"};
  return names;
}

OpenAiRequest parse_openai_generation(const nlohmann::json& body, const ModelDefaults& model,
                                      const ServerLimits& limits) {
  JsonFields f(body);
  auto o = parse_openai_common(f, model, limits);
  o.job.config.scheduler = model.scheduler;
  f.reject_unknown();
  finish(o.job, model, limits);
  return o;
}

OpenAiRequest parse_openai_edit(const nlohmann::json& fields, Image image,
                                const ModelDefaults& model, const ServerLimits& limits) {
  JsonFields f(fields);
  auto o = parse_openai_common(f, model, limits);
  o.job.kind = model.supports(JobKind::edit) ? JobKind::edit : JobKind::img2img;
  o.job.config.scheduler = model.scheduler;
  if (o.job.kind == JobKind::img2img)
    o.job.config.strength = f.number("strength", 0, 1).value_or(0.75);
  o.job.init_image = std::move(image);
  f.reject_unknown();
  finish(o.job, model, limits);
  return o;
}

}  // namespace diffuse::server
