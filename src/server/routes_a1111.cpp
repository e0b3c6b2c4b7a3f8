// AUTOMATIC1111's web UI API (/sdapi/v1/*), as its clients (Krita, ComfyUI nodes, scripts,
// bots) call it: field names, defaults and response shapes of A1111.
#include <httplib.h>

#include "server/base64.h"
#include "server/json_fields.h"
#include "server/request_conditions.h"
#include "server/server_state.h"

namespace diffuse::server {
namespace {

std::string a1111_sampler_name(const std::string& scheduler) {
  for (const auto& s : a1111_samplers())
    if (scheduler == s.scheduler) return s.name;
  return scheduler;
}

// A1111's response: images, the request with its defaults filled in, and "info" as a JSON
// string (that is how A1111 sends it).
nlohmann::json generation_response(const ServerState& state, const JobSnapshot& job,
                                   const nlohmann::json& body,
                                   const std::vector<std::string>& ignored) {
  const auto& r = job.request;
  nlohmann::json images = nlohmann::json::array(), seeds = nlohmann::json::array(),
                 prompts = nlohmann::json::array(), infotexts = nlohmann::json::array();
  for (const auto& im : job.output->images) {
    images.push_back(base64_encode(im.png));
    seeds.push_back(im.parameters.seed);
    prompts.push_back(im.parameters.prompt);
    infotexts.push_back(im.parameters.to_text());
  }
  const std::string scheduler =
      job.output->images.empty() ? "" : job.output->images[0].parameters.scheduler;
  nlohmann::json parameters = body;
  parameters["prompt"] = r["prompt"][0];
  parameters["negative_prompt"] = r["negative_prompt"].empty() ? "" : r["negative_prompt"][0];
  parameters["steps"] = r["steps"];
  parameters["cfg_scale"] = r["guidance_scale"];
  parameters["width"] = r["width"];
  parameters["height"] = r["height"];
  parameters["seed"] = r["seed"];
  parameters["batch_size"] = r["num_images"];
  parameters["n_iter"] = r["batch_count"];
  parameters["sampler_name"] = a1111_sampler_name(scheduler);
  if (r.contains("strength")) parameters["denoising_strength"] = r["strength"];
  if (parameters.contains("init_images")) parameters["init_images"] = nullptr;  // not echoed back
  nlohmann::json info = {
      {"prompt", r["prompt"][0]},
      {"all_prompts", prompts},
      {"negative_prompt", parameters["negative_prompt"]},
      {"seed", r["seed"]},
      {"all_seeds", seeds},
      {"steps", r["steps"]},
      {"cfg_scale", r["guidance_scale"]},
      {"width", r["width"]},
      {"height", r["height"]},
      {"sampler_name", parameters["sampler_name"]},
      {"batch_size", r["num_images"]},
      {"denoising_strength", r.contains("strength") ? r["strength"] : nlohmann::json()},
      {"sd_model_name", state.engine.model_name()},
      {"infotexts", infotexts},
      {"job_id", job.id},
      {"ignored_fields", ignored},
      {"warnings", job.output->warnings}};
  return {{"images", images}, {"parameters", parameters}, {"info", info.dump()}};
}

void generate(ServerState& state, const httplib::Request& req, httplib::Response& res,
              bool img2img) {
  guarded(res, [&] {
    const auto body = parse_json_body(req.body);
    std::vector<std::string> ignored;
    auto request = parse_a1111(body, img2img, state.defaults, state.options.limits, &ignored);
    const auto job = run_to_end(state, std::move(request));
    reply_json(res, generation_response(state, job, body, ignored));
  });
}

constexpr const char* kInterrupt = "/sdapi/v1/interrupt";
constexpr const char* kSkip = "/sdapi/v1/skip";

}  // namespace

bool is_bodyless_route(const std::string& path) {
  return path == kInterrupt || path == kSkip;
}

void add_a1111_routes(httplib::Server& server, ServerState& state) {
  server.Post("/sdapi/v1/txt2img", [&state](const httplib::Request& req, httplib::Response& res) {
    generate(state, req, res, false);
  });
  server.Post("/sdapi/v1/img2img", [&state](const httplib::Request& req, httplib::Response& res) {
    generate(state, req, res, true);
  });

  server.Get("/sdapi/v1/progress", [&state](const httplib::Request& req, httplib::Response& res) {
    const bool skip_image = req.get_param_value("skip_current_image") == "true";
    auto job = state.queue.current_or_last();
    nlohmann::json progress_state = {
        {"skipped", false},
        {"interrupted", job && (job->interrupted || job->state == JobState::cancelled)},
        {"job", job ? job->id : ""},
        {"job_count", state.queue.waiting() + (job && job->state == JobState::running ? 1 : 0)},
        {"job_timestamp", job ? std::to_string(static_cast<int64_t>(job->created_at)) : "0"},
        {"job_no", 0},
        {"sampling_step", job ? job->progress.step : 0},
        {"sampling_steps", job ? job->progress.total : 0}};
    const bool running = job && job->state == JobState::running;
    const double fraction = running && job->progress.total > 0
                                ? static_cast<double>(job->progress.step) / job->progress.total
                                : 0.0;
    nlohmann::json image = nullptr;
    if (running && !skip_image && !job->progress.preview_png.empty())
      image = base64_encode(job->progress.preview_png);
    reply_json(res,
               {{"progress", fraction},
                {"eta_relative", running && job->progress.eta_s >= 0 ? job->progress.eta_s : 0.0},
                {"state", progress_state},
                {"current_image", image},
                {"textinfo", running ? nlohmann::json("sampling") : nlohmann::json()}});
  });

  // A1111 clients send these with no body, an empty one or {}: the body is not read. The
  // running job finishes at its next step and its request gets the images as far as they got
  // (A1111 decodes the last step's denoised estimate); skip does the same (diffuse runs a
  // job's batches as one, so there is no next batch to go on with).
  // Registered with a content reader: httplib answers a POST with neither Content-Length nor
  // chunked encoding (curl -X POST) 400 before a plain handler runs; a reader handler runs
  // first and drains a body only where there is one.
  auto interrupt = [&state](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& content) {
    if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding"))
      content([](const char*, size_t) { return true; });
    auto job = state.queue.current_or_last();
    if (job && job->state == JobState::running) state.queue.interrupt(job->id);
    reply_json(res, nlohmann::json::object());
  };
  server.Post(kInterrupt, interrupt);
  server.Post(kSkip, interrupt);

  server.Get("/sdapi/v1/samplers", [&state](const httplib::Request&, httplib::Response& res) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& s : a1111_samplers(state.defaults)) {
      nlohmann::json aliases = nlohmann::json::array();
      for (const char* a : s.aliases) aliases.push_back(a);
      aliases.push_back(s.scheduler);
      out.push_back(
          {{"name", s.name}, {"aliases", aliases}, {"options", nlohmann::json::object()}});
    }
    reply_json(res, out);
  });

  server.Get("/sdapi/v1/sd-models", [&state](const httplib::Request&, httplib::Response& res) {
    const auto name = state.engine.model_name();
    reply_json(res, nlohmann::json::array({{{"title", name},
                                            {"model_name", name},
                                            {"hash", nullptr},
                                            {"sha256", nullptr},
                                            {"filename", state.engine.model_path()},
                                            {"config", nullptr}}}));
  });

  // The ControlNet extension's lists: the folders of --controlnet-dir, and its preprocessors.
  server.Get("/controlnet/model_list", [&state](const httplib::Request&, httplib::Response& res) {
    reply_json(res, {{"model_list", controlnet_names(state.options.controlnet_dir)}});
  });
  server.Get("/controlnet/module_list", [](const httplib::Request&, httplib::Response& res) {
    reply_json(res, {{"module_list", {"none", "canny"}}});
  });

  server.Get("/sdapi/v1/options", [&state](const httplib::Request&, httplib::Response& res) {
    reply_json(res, {{"sd_model_checkpoint", state.engine.model_name()},
                     {"samples_format", "png"},
                     {"sd_checkpoint_hash", nullptr},
                     {"CLIP_stop_at_last_layers", 1},
                     {"eta_ddim", 0.0}});
  });

  // One model is loaded for the server's lifetime: switching checkpoints is refused, other
  // options are accepted and have no effect.
  server.Post("/sdapi/v1/options", [&state](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const auto body = parse_json_body(req.body);
      auto it = body.find("sd_model_checkpoint");
      if (it != body.end() &&
          !(it->is_string() && it->get<std::string>() == state.engine.model_name()))
        throw InvalidArgument("sd_model_checkpoint: this server serves one model, '" +
                              state.engine.model_name() +
                              "'; start another diffuse serve for another model");
      reply_json(res, nullptr);
    });
  });
}

}  // namespace diffuse::server
