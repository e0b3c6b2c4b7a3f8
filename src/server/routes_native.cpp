// The native API: POST /v1/jobs, GET /v1/jobs[/{id}[/events|/images/{k}.png|/preview.png]],
// DELETE /v1/jobs/{id}, GET /v1/status.
#include <httplib.h>

#include "server/base64.h"
#include "server/json_fields.h"
#include "server/server_state.h"

namespace diffuse::server {
namespace {

constexpr auto kEventWait = std::chrono::seconds(10);

std::optional<JobSnapshot> find_job(ServerState& state, const httplib::Request& req,
                                    httplib::Response& res) {
  auto job = state.queue.get(req.matches[1]);
  if (!job)
    reply_error(
        res, 404,
        "no job '" + std::string(req.matches[1]) + "' (unknown, or dropped from the history)");
  return job;
}

// One Server-Sent Event: progress (with the preview when it changed), or the final state.
std::string event_text(const JobSnapshot& job, bool with_preview, int* last_preview_step) {
  auto j = job_json(job, false);
  if (with_preview && !job.progress.preview_png.empty() &&
      job.progress.preview_step != *last_preview_step) {
    j["preview"] = "data:image/png;base64," + base64_encode(job.progress.preview_png);
    *last_preview_step = job.progress.preview_step;
  }
  const char* name = is_finished(job.state) ? "done" : "progress";
  return std::string("event: ") + name + "\ndata: " + j.dump() + "\n\n";
}

}  // namespace

void add_native_routes(httplib::Server& server, ServerState& state) {
  server.Post("/v1/jobs", [&state](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      auto request =
          parse_native_job(parse_json_body(req.body), state.defaults, state.options.limits);
      const std::string id = state.queue.submit(std::move(request));
      res.set_header("Location", "/v1/jobs/" + id);
      reply_json(res, job_json(*state.queue.get(id), false), 202);
    });
  });

  server.Get("/v1/jobs", [&state](const httplib::Request&, httplib::Response& res) {
    nlohmann::json jobs = nlohmann::json::array();
    for (const auto& j : state.queue.list()) jobs.push_back(job_json(j, false));
    reply_json(res, {{"jobs", jobs}});
  });

  server.Get(R"(/v1/jobs/([0-9a-f]{1,32}))",
             [&state](const httplib::Request& req, httplib::Response& res) {
               if (auto job = find_job(state, req, res))
                 reply_json(res, job_json(*job, req.get_param_value("b64") == "1"));
             });

  server.Delete(R"(/v1/jobs/([0-9a-f]{1,32}))",
                [&state](const httplib::Request& req, httplib::Response& res) {
                  auto job = find_job(state, req, res);
                  if (!job) return;
                  if (!state.queue.cancel(job->id)) {
                    reply_json(res, job_json(*state.queue.get(job->id),
                                             false));  // already finished: nothing to do
                    return;
                  }
                  reply_json(res, job_json(*state.queue.get(job->id), false), 202);
                });

  server.Get(R"(/v1/jobs/([0-9a-f]{1,32})/images/(\d{1,4})\.png)",
             [&state](const httplib::Request& req, httplib::Response& res) {
               auto job = find_job(state, req, res);
               if (!job) return;
               const size_t k = std::stoul(req.matches[2]);
               if (!job->output || k >= job->output->images.size()) {
                 reply_error(res, 404,
                             "job " + job->id + " has no image " + std::to_string(k) +
                                 (job->output ? "" : " (it has not succeeded)"));
                 return;
               }
               if (req.get_param_value("download") == "1")
                 res.set_header("Content-Disposition", "attachment; filename=\"diffuse-" + job->id +
                                                           "-" + std::to_string(k) + ".png\"");
               res.set_header("Cache-Control", "private, max-age=86400");
               res.set_content(job->output->images[k].png, "image/png");
             });

  server.Get(R"(/v1/jobs/([0-9a-f]{1,32})/preview\.png)",
             [&state](const httplib::Request& req, httplib::Response& res) {
               auto job = find_job(state, req, res);
               if (!job) return;
               if (job->progress.preview_png.empty()) {
                 reply_error(res, 404, "job " + job->id + " has no preview yet");
                 return;
               }
               res.set_header("Cache-Control", "no-store");
               res.set_content(job->progress.preview_png, "image/png");
             });

  server.Get(R"(/v1/jobs/([0-9a-f]{1,32})/events)", [&state](const httplib::Request& req,
                                                             httplib::Response& res) {
    auto job = find_job(state, req, res);
    if (!job) return;
    const bool with_preview = req.get_param_value("preview") != "0";
    const std::string id = job->id;
    auto last_seq = std::make_shared<uint64_t>(0);
    auto last_preview = std::make_shared<int>(-1);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [&state, id, with_preview, last_seq, last_preview](size_t, httplib::DataSink& sink) {
          auto snap = state.queue.wait(id, *last_seq, kEventWait);
          if (!snap) {  // dropped from the history meanwhile
            sink.done();
            return true;
          }
          std::string text;
          if (snap->seq > *last_seq) {
            *last_seq = snap->seq;
            text = event_text(*snap, with_preview, last_preview.get());
          } else {
            text = ": keep-alive\n\n";  // lets proxies and clients see the stream is alive
          }
          if (!sink.write(text.data(), text.size())) return false;
          if (is_finished(snap->state) || state.queue.stopping()) sink.done();
          return true;
        });
  });

  server.Get("/v1/status", [&state](const httplib::Request&, httplib::Response& res) {
    reply_json(res, status_json(state));
  });
}

}  // namespace diffuse::server
