// Request bodies of the three APIs -> JobRequest: the native one (/v1/jobs), AUTOMATIC1111's
// (/sdapi/v1/txt2img, img2img) and OpenAI's (/v1/images/generations, edits). Every field is
// type- and range-checked against the server's limits before anything is allocated.
#pragma once
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "server/job.h"
#include "server/server_options.h"

namespace diffuse::server {

// What a request falls back to, and what the loaded model can do.
struct ModelDefaults {
  std::string name;  // as clients see it (the folder or file name); OpenAI's "model" may give it
  int width = 512, height = 512;
  // What image sides must be multiples of: the VAE's scale factor (times the patch size of a
  // transformer), from the model's configs.
  int size_multiple = 8;
  int vae_factor = 8;     // pixels per latent pixel: what VAE tile sides must be multiples of
  std::string scheduler;  // the model's own
  int steps = 25;
  double guidance_scale = 7.5;
  double image_guidance_scale = 4.0;  // edit jobs (HiDream-E1's reference value)
  std::vector<JobKind> kinds = {JobKind::txt2img, JobKind::img2img};
  // Scheduler names a request may choose; empty: only the model's own.
  std::vector<std::string> schedulers;
  // Models that scale images to their own area (HiDream): the size a txt2img request's width x
  // height (only an aspect ratio there) and an edit's source image become; InvalidArgument when
  // a side would vanish. Unset: the size is the one made, in multiples of size_multiple.
  std::function<std::pair<int, int>(int width, int height)> txt2img_size;
  // `auto_resize`: EditOptions::auto_resize, honoured where edit_auto_resize is set.
  std::function<std::pair<int, int>(int width, int height, bool auto_resize)> edit_size;
  // The model's edits can keep the source's own size (FLUX Kontext): the job field
  // "auto_resize" is accepted.
  bool edit_auto_resize = false;
  // Prompt syntaxes the model's text encoder takes ("a1111" needs a CLIP tokenizer), the first
  // being the default of the native and A1111 APIs.
  std::vector<std::string> prompt_syntaxes = {"a1111", "plain"};
  // Where A1111 prompts' <lora:NAME:SCALE> tags find NAME.safetensors (serve --lora-dir);
  // empty: such tags are refused. Clients name files in it, never paths.
  std::string lora_dir;
  // Inpainting masks and ControlNets (UNet models); ControlNets are looked up by name in
  // controlnet_dir (serve --controlnet-dir; empty: none).
  bool masks = true;
  bool controlnets = true;
  std::string controlnet_dir;

  // Whether the model is a UNet that DeepCache and token merging apply to.
  bool unet_accelerators = true;
  // DiT models: InvalidArgument for a cache the model cannot run (a block range beyond it).
  std::function<void(const DitCacheOptions&)> check_cache;
  // The folder's settings for a bare cache method name ("fbcache" -> "fbcache:0.25"):
  // pipeline::dit_cache_defaults.
  std::map<std::string, std::string> cache_defaults;

  bool supports(JobKind kind) const;
  std::string kinds_text() const;  // "txt2img, img2img"
};

// {"mode": "txt2img"|"img2img"|"edit", "prompt": str|[str], "negative_prompt": str|[str],
//  "width", "height", "steps", "guidance_scale", "scheduler", "seed" (-1/absent = random),
//  "num_images", "batch_count", "strength", "eta", "init_image" (base64 PNG), "preview",
//  "prompt_syntax" ("a1111" | "plain"), edit: "image_guidance_scale", "clip_cfg_norm",
//  "refine_strength"; UNet models: "deepcache" (interval, 1 = off), "deepcache_layer",
//  "deepcache_block", "deepcache_schedule" ("uniform" | "non-uniform"), "tome" (ratio),
//  "tome_policy" ("auto": left out where it measured no faster | "always"); FLUX Kontext
//  edits: "auto_resize" (true: the preferred Kontext resolution, false: the source's size)}.
// Unknown fields are errors, and so are modes the model does not run.
JobRequest parse_native_job(const nlohmann::json& body, const ModelDefaults& model,
                            const ServerLimits& limits);

// A1111's StableDiffusionProcessing fields and defaults; fields that change nothing here
// (styles, save_images, ...) are accepted and listed in `ignored`; ones that would change the
// image in a way diffuse does not support (enable_hr, a Karras schedule...) are errors.
JobRequest parse_a1111(const nlohmann::json& body, bool img2img, const ModelDefaults& model,
                       const ServerLimits& limits, std::vector<std::string>* ignored);

// A1111 sampler names (with aliases) <-> diffuse scheduler names.
struct A1111Sampler {
  const char* name;
  const char* scheduler;
  std::vector<const char*> aliases;
};
const std::vector<A1111Sampler>& a1111_samplers();
// Those whose scheduler the model runs.
std::vector<A1111Sampler> a1111_samplers(const ModelDefaults& model);

// OpenAI images: generations (JSON) and edits (multipart fields, the image already decoded):
// an edit is an instruction edit on a model that runs those (HiDream-E1), else img2img.
struct OpenAiRequest {
  JobRequest job;
  std::string response_format;        // "b64_json" or "url"
  std::string output_format = "png";  // "png", "jpeg" or "webp" (b64_json only)
  int output_compression = 100;       // jpeg/webp quality, 0..100 (100: webp lossless)
};
// The model names an OpenAI request may give besides the served model's own: clients written
// for OpenAI send these, and this server answers them with the one model it serves.
const std::vector<std::string>& openai_model_aliases();
OpenAiRequest parse_openai_generation(const nlohmann::json& body, const ModelDefaults& model,
                                      const ServerLimits& limits);
// Both take OpenAI's fields: prompt, n, size, response_format, seed, output_format,
// output_compression, model (the served model or an alias), quality, style, background (not
// "transparent": the models draw opaque images), moderation, user; unknown values are errors
// naming the field and what it takes.
// fields: the multipart text fields (prompt, n, size, response_format, strength, ...).
OpenAiRequest parse_openai_edit(const nlohmann::json& fields, Image image,
                                const ModelDefaults& model, const ServerLimits& limits);

// A base64 PNG from a request, checked against the upload limit from its header.
Image decode_image_field(const std::string& base64, const std::string& field,
                         const ServerLimits& limits);

}  // namespace diffuse::server
