#include "server/server_state.h"

#include <httplib.h>

#include <cmath>

#include "device/device.h"
#include "device/memory.h"
#include "server/base64.h"
#include "server/request_conditions.h"

namespace diffuse::server {

ServerState::ServerState(Engine& e, ServerOptions o)
    : engine(e),
      options(std::move(o)),
      queue([&e](const JobRequest& r, JobContext& c) { return e.run(r, c); }, options.max_waiting,
            options.keep_finished) {
  defaults = e.defaults();
  defaults.name = e.model_name();
  defaults.lora_dir = options.lora_dir;
  defaults.controlnet_dir = options.controlnet_dir;
}

void reply_json(httplib::Response& res, const nlohmann::json& body, int status) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 404 ? "not_found"
                     : status == 409 ? "cancelled"
                     : status == 413 ? "request_too_large"
                     : status == 503 ? "unavailable"
                     : status < 500  ? "invalid_request_error"
                                     : "server_error";
  reply_json(res, {{"error", {{"message", message}, {"type", type}}}, {"detail", message}}, status);
}

void guarded(httplib::Response& res, const std::function<void()>& handler) {
  try {
    handler();
  } catch (const QueueFull& e) {
    res.set_header("Retry-After", std::to_string(static_cast<int>(std::ceil(e.retry_after_s))));
    reply_error(res, 503, e.what());
  } catch (const ShuttingDown& e) {
    reply_error(res, 503, e.what());
  } catch (const Cancelled& e) {
    reply_error(res, 409, e.what());
  } catch (const InvalidArgument& e) {
    reply_error(res, 400, e.what());
  } catch (const FormatError& e) {
    reply_error(res, 400, e.what());
  } catch (const std::exception& e) {
    reply_error(res, 500, e.what());
  }
}

nlohmann::json job_json(const JobSnapshot& job, bool with_base64) {
  const auto& p = job.progress;
  nlohmann::json j = {{"id", job.id},
                      {"state", to_string(job.state)},
                      {"mode", to_string(job.kind)},
                      {"api", job.api},
                      {"position", job.position},
                      {"progress",
                       {{"step", p.step},
                        {"total", p.total},
                        {"fraction", p.total > 0 ? static_cast<double>(p.step) / p.total
                                                 : (is_finished(job.state) ? 1.0 : 0.0)},
                        {"elapsed_s", p.elapsed_s},
                        {"eta_s", p.eta_s}}},
                      {"seed", job.seed},
                      {"request", job.request},
                      {"created_at", job.created_at},
                      {"started_at", job.started_at},
                      {"finished_at", job.finished_at},
                      {"preview_url", p.preview_png.empty()
                                          ? nlohmann::json()
                                          : nlohmann::json("/v1/jobs/" + job.id + "/preview.png")},
                      {"images", nlohmann::json::array()}};
  if (!job.error.empty()) j["error"] = job.error;
  if (job.output) {
    for (size_t i = 0; i < job.output->images.size(); ++i) {
      const auto& im = job.output->images[i];
      nlohmann::json e = {{"index", i},
                          {"url", "/v1/jobs/" + job.id + "/images/" + std::to_string(i) + ".png"},
                          {"seed", im.parameters.seed},
                          {"width", im.parameters.width},
                          {"height", im.parameters.height},
                          {"prompt", im.parameters.prompt},
                          {"parameters", im.parameters.to_text()}};
      if (with_base64) e["b64_png"] = base64_encode(im.png);
      j["images"].push_back(e);
    }
    j["timings"] = job.output->timings;
    j["warnings"] = job.output->warnings;
  }
  return j;
}

nlohmann::json status_json(const ServerState& state) {
  const auto& info = state.engine.info();
  const auto mem = device::memory_stats();
  nlohmann::json memory = {{"rss_bytes", mem.rss_bytes}, {"peak_rss_bytes", mem.peak_rss_bytes}};
  try {
    const auto dm = device::device_memory(device::resolve_device(info.device));
    if (dm.has_allocator)
      memory["device"] = {{"device", dm.device},
                          {"allocated_bytes", dm.allocator.allocated_bytes},
                          {"reserved_bytes", dm.allocator.reserved_bytes},
                          {"peak_allocated_bytes", dm.allocator.peak_allocated_bytes},
                          {"total_bytes", dm.allocator.total_bytes}};
  } catch (const std::exception&) {
    // The device cannot be queried: RSS only.
  }
  const auto counts = state.queue.counts();
  nlohmann::json queue = {
      {"waiting", state.queue.waiting()}, {"max_waiting", state.queue.max_waiting()},
      {"submitted", counts.submitted},    {"succeeded", counts.succeeded},
      {"failed", counts.failed},          {"cancelled", counts.cancelled},
      {"rejected", counts.rejected},      {"running", nullptr}};
  auto cur = state.queue.current_or_last();
  if (cur && cur->state == JobState::running) queue["running"] = job_json(*cur, false);
  nlohmann::json last = nullptr;
  if (auto l = state.queue.last_finished()) {
    last = {{"id", l->id}, {"state", to_string(l->state)}, {"finished_at", l->finished_at}};
    if (l->output) last["timings"] = l->output->timings;
    if (!l->error.empty()) last["error"] = l->error;
  }
  nlohmann::json modes = nlohmann::json::array();
  for (auto k : state.defaults.kinds) modes.push_back(to_string(k));
  return {
      {"engine", "diffuse"},
      {"version", DIFFUSE_VERSION},
      {"model", state.engine.model_name()},
      {"model_path", info.model},
      {"device", info.device},
      {"text_encoder_device", info.text_encoder_device},
      {"vae_device", info.vae_device},
      {"dtype", info.unet_dtype},
      {"weights", info.weights},
      {"text_encoder_dtype", info.text_encoder_dtype},
      {"vae_dtype", info.vae_dtype},
      {"attention", info.attention},
      {"scheduler", info.scheduler},
      {"schedulers", state.defaults.schedulers},
      {"modes", modes},
      {"default_steps", state.defaults.steps},
      // The job field "cache" (accel/dit_cache.h): DiT models only.
      {"dit_cache", !state.defaults.unet_accelerators},
      // Inpainting masks on image jobs, and the ControlNets jobs may name.
      {"masks", state.defaults.masks},
      {"controlnets", state.defaults.controlnets ? controlnet_names(state.defaults.controlnet_dir)
                                                 : std::vector<std::string>{}},
      {"default_image_guidance_scale", state.defaults.image_guidance_scale},
      {"default_guidance_scale", state.defaults.guidance_scale},
      {"default_width", info.default_width},
      {"default_height", info.default_height},
      {"loras", info.loras},
      {"offload", info.offload},
      {"load_s", info.load_s},
      {"uptime_s",
       std::chrono::duration<double>(std::chrono::steady_clock::now() - state.started).count()},
      {"memory", memory},
      {"queue", queue},
      {"last_job", last},
      {"limits",
       {{"max_side", state.options.limits.max_side},
        {"max_pixels", state.options.limits.max_pixels},
        {"max_steps", state.options.limits.max_steps},
        {"max_images", state.options.limits.max_images},
        {"max_prompt_chars", state.options.limits.max_prompt_chars},
        {"max_body_bytes", state.options.limits.max_body_bytes}}}};
}

JobSnapshot run_to_end(ServerState& state, JobRequest request) {
  const std::string id = state.queue.submit(std::move(request));
  auto job = state.queue.wait_finished(id);
  if (!job) throw Error("job " + id + " was dropped before it finished");
  if (job->state == JobState::cancelled) throw Cancelled("job " + id + " was " + job->error);
  if (job->state != JobState::succeeded)
    throw Error(job->error.empty() ? "job " + id + " did not finish" : job->error);
  return *job;
}

}  // namespace diffuse::server
