// Request bodies of the three APIs -> JobRequest: the native one (/v1/jobs), AUTOMATIC1111's
// (/sdapi/v1/txt2img, img2img) and OpenAI's (/v1/images/generations, edits). Every field is
// type- and range-checked against the server's limits before anything is allocated.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/job.h"
#include "server/server_options.h"

namespace diffuse::server {

// What a request falls back to.
struct ModelDefaults {
  int width = 512, height = 512;
  std::string scheduler;  // the model's own
};

// {"mode": "txt2img"|"img2img", "prompt": str|[str], "negative_prompt": str|[str], "width",
//  "height", "steps", "guidance_scale", "scheduler", "seed" (-1/absent = random), "num_images",
//  "batch_count", "strength", "eta", "init_image" (base64 PNG), "preview"}. Unknown fields are
// errors.
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

// OpenAI images: generations (JSON) and edits (multipart fields, the image already decoded).
struct OpenAiRequest {
  JobRequest job;
  std::string response_format;  // "b64_json" or "url"
};
OpenAiRequest parse_openai_generation(const nlohmann::json& body, const ModelDefaults& model,
                                      const ServerLimits& limits);
// fields: the multipart text fields (prompt, n, size, response_format, strength).
OpenAiRequest parse_openai_edit(const nlohmann::json& fields, Image image,
                                const ModelDefaults& model, const ServerLimits& limits);

// A base64 PNG from a request, checked against the upload limit from its header.
Image decode_image_field(const std::string& base64, const std::string& field,
                         const ServerLimits& limits);

}  // namespace diffuse::server
