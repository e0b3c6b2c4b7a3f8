// `diffuse serve`: the HTTP server around one loaded model. Routes: the web page (/), the
// native API (/v1/jobs, /v1/status), AUTOMATIC1111's (/sdapi/v1/*) and OpenAI's
// (/v1/images/*). Requests run one at a time through one job queue.
#pragma once
#include <memory>
#include <string>

#include "server/engine.h"
#include "server/server_options.h"

namespace httplib {
class Server;
}

namespace diffuse::server {

struct ServerState;

class HttpServer {
 public:
  // Refuses (InvalidArgument) a non-loopback host without an API key.
  HttpServer(Engine& engine, ServerOptions options);
  ~HttpServer();

  // Binds the listening socket; returns the port (options.port 0 = a free one). IoError if the
  // address cannot be bound.
  int bind();
  // Serves until stop(); returns when the listener has closed.
  void serve();
  // Stops accepting; cancels waiting jobs, and the running one when cancel_running (else lets
  // it finish); then closes the listener. Safe from any thread, idempotent.
  void stop(bool cancel_running);
  bool running() const;
  ServerState& state() { return *state_; }

 private:
  std::unique_ptr<ServerState> state_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = -1;
};

}  // namespace diffuse::server
