// OpenAI's Images API: POST /v1/images/generations (JSON) and /v1/images/edits (multipart),
// answered {"created", "data": [{"b64_json"} | {"url"}]}.
#include <httplib.h>

#include <ctime>
#include <limits>

#include "diffuse/image.h"
#include "server/base64.h"
#include "server/json_fields.h"
#include "server/request_conditions.h"
#include "server/server_state.h"

namespace diffuse::server {
namespace {

// The image in the format the request asked for (the job keeps PNG files).
std::string encoded_image(const std::string& png, const OpenAiRequest& o) {
  if (o.output_format == "png") return png;
  const Image image = decode_png(png, "output image", std::numeric_limits<uint64_t>::max());
  return o.output_format == "jpeg" ? encode_jpeg(image, o.output_compression)
                                   : encode_webp(image, o.output_compression);
}

nlohmann::json images_response(const httplib::Request& req, const JobSnapshot& job,
                               const OpenAiRequest& o) {
  nlohmann::json data = nlohmann::json::array();
  const std::string host = req.get_header_value("Host");
  for (size_t i = 0; i < job.output->images.size(); ++i) {
    const auto& im = job.output->images[i];
    if (o.response_format == "url")
      data.push_back({{"url", "http://" + host + "/v1/jobs/" + job.id + "/images/" +
                                  std::to_string(i) + ".png"},
                      {"revised_prompt", im.parameters.prompt}});
    else
      data.push_back({{"b64_json", base64_encode(encoded_image(im.png, o))},
                      {"revised_prompt", im.parameters.prompt}});
  }
  return {{"created", static_cast<int64_t>(std::time(nullptr))},
          {"data", data},
          {"output_format", o.output_format}};
}

// Multipart text fields as JSON; numbers where OpenAI's fields are numbers, so a bad one is
// reported with its type like in a JSON body.
nlohmann::json multipart_fields(const httplib::Request& req) {
  nlohmann::json fields = nlohmann::json::object();
  for (const auto& [name, part] : req.files) {
    if (!part.filename.empty()) continue;  // files
    if (name == "n" || name == "seed" || name == "strength" || name == "output_compression") {
      try {
        size_t used = 0;
        const double v = std::stod(part.content, &used);
        if (used == part.content.size()) {
          if (name == "strength")
            fields[name] = v;
          else
            fields[name] = static_cast<int64_t>(v) == v ? nlohmann::json(static_cast<int64_t>(v))
                                                        : nlohmann::json(v);
          continue;
        }
      } catch (const std::exception&) {
      }
    }
    fields[name] = part.content;
  }
  return fields;
}

}  // namespace

void add_openai_routes(httplib::Server& server, ServerState& state) {
  server.Post("/v1/images/generations",
              [&state](const httplib::Request& req, httplib::Response& res) {
                guarded(res, [&] {
                  auto o = parse_openai_generation(parse_json_body(req.body), state.defaults,
                                                   state.options.limits);
                  const auto job = run_to_end(state, std::move(o.job));
                  reply_json(res, images_response(req, job, o));
                });
              });

  server.Post("/v1/images/edits", [&state](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      if (!req.is_multipart_form_data())
        throw InvalidArgument(
            "images/edits takes multipart/form-data with an 'image' file and a 'prompt'");
      const char* key = req.has_file("image")     ? "image"
                        : req.has_file("image[]") ? "image[]"
                                                  : nullptr;
      if (!key) throw InvalidArgument("image: required (a PNG file part)");
      if (req.files.count(key) > 1)
        throw InvalidArgument("image: only one image per request is supported");
      Image image = decode_png(req.get_file_value(key).content, "image",
                               static_cast<uint64_t>(state.options.limits.max_upload_pixels));
      auto fields = multipart_fields(req);
      fields.erase("image");
      fields.erase("image[]");
      fields.erase("mask");
      auto o = parse_openai_edit(fields, std::move(image), state.defaults, state.options.limits);
      if (req.has_file("mask"))
        read_openai_mask(req.get_file_value("mask").content, o.job, state.defaults,
                         state.options.limits);
      const auto job = run_to_end(state, std::move(o.job));
      reply_json(res, images_response(req, job, o));
    });
  });
}

}  // namespace diffuse::server
