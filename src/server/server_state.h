// What every route of the server shares: the model, the queue, the options.
#pragma once
#include <chrono>
#include <string>

#include "server/engine.h"
#include "server/job_queue.h"
#include "server/requests.h"
#include "server/server_options.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace diffuse::server {

struct ServerState {
  ServerState(Engine& engine, ServerOptions options);

  Engine& engine;
  ServerOptions options;
  ModelDefaults defaults;
  JobQueue queue;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

// Replies. Errors have one shape for every API (OpenAI's, with A1111's "detail" beside it):
// {"error": {"message": ..., "type": ...}, "detail": ...}.
void reply_json(httplib::Response& res, const nlohmann::json& body, int status = 200);
void reply_error(httplib::Response& res, int status, const std::string& message);
// Runs a handler and turns what it throws into the right status: InvalidArgument and
// FormatError 400, QueueFull and ShuttingDown 503 (with Retry-After), Cancelled 409, else 500.
void guarded(httplib::Response& res, const std::function<void()>& handler);

// JSON of a job for the native API; images as URLs, and as base64 too when with_base64.
nlohmann::json job_json(const JobSnapshot& job, bool with_base64);
nlohmann::json status_json(const ServerState& state);

// Waits for a synchronous API's job (A1111, OpenAI) and returns it finished; throws Cancelled
// or Error with the job's message when it did not succeed.
JobSnapshot run_to_end(ServerState& state, JobRequest request);

void add_native_routes(httplib::Server& server, ServerState& state);
void add_a1111_routes(httplib::Server& server, ServerState& state);
// POST routes that clients call without a body (A1111's interrupt and skip); every other POST
// without Content-Length or chunked encoding is refused at once (httplib would wait for the
// connection to close, its read timeout, and then answer 400).
bool is_bodyless_route(const std::string& path);
void add_openai_routes(httplib::Server& server, ServerState& state);
void add_web_routes(httplib::Server& server);

}  // namespace diffuse::server
