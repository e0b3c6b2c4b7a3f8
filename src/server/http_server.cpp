#include "server/http_server.h"

#include <httplib.h>

#include "server/listen_backlog.h"
#include "server/server_state.h"

namespace diffuse::server {
namespace {

// Compares in time independent of where the strings differ, so the key cannot be guessed
// byte by byte from response times.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// The web page and its assets carry no data and are served without the key (the page asks
// for it); everything under the APIs needs it.
bool is_public_path(const std::string& path) {
  return path == "/" || path == "/index.html" || path == "/app.js" || path == "/style.css" ||
         path == "/favicon.ico";
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

HttpServer::HttpServer(Engine& engine, ServerOptions options) {
  if (!is_loopback_host(options.host) && options.api_key.empty())
    throw InvalidArgument(
        "--host " + options.host +
        ": listening beyond this machine needs an API key (--api-key or DIFFUSE_API_KEY)");
  state_ = std::make_unique<ServerState>(engine, std::move(options));
  http_ = std::make_unique<httplib::Server>();
  auto& svr = *http_;
  const auto& o = state_->options;
  const int threads = std::max(4, o.http_threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(o.limits.max_body_bytes);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);

  const std::string key = o.api_key, cors = o.cors_origin;
  svr.set_pre_routing_handler([key, cors](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") {  // CORS preflight
      if (cors.empty()) {
        reply_error(res, 405,
                    "cross-origin requests are not enabled on this server (--cors ORIGIN)");
      } else {
        res.status = 204;
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!key.empty() && !is_public_path(req.path)) {
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      if (auth.compare(0, prefix.size(), prefix) != 0 ||
          !constant_time_equal(auth.substr(prefix.size()), key)) {
        res.set_header("WWW-Authenticate", "Bearer");
        reply_error(res, 401,
                    auth.empty() ? "this server needs an API key: send 'Authorization: Bearer KEY'"
                                 : "the API key is not valid");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if ((req.method == "POST" || req.method == "PUT" || req.method == "PATCH") &&
        !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding") &&
        !is_bodyless_route(req.path)) {
      reply_error(res, 400,
                  "the " + req.method + " request to " + req.path +
                      " has no Content-Length (nor chunked encoding): send the JSON body with its "
                      "length");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  if (!cors.empty()) {
    svr.set_post_routing_handler([cors](const httplib::Request&, httplib::Response& res) {
      res.set_header("Access-Control-Allow-Origin", cors);
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      res.set_header("Vary", "Origin");
    });
  }
  // Errors httplib answers itself (unknown route, body too large) get the same JSON shape.
  svr.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (res.status == 404)
          reply_error(res, 404, "no route " + req.method + " " + req.path);
        else if (res.status == 413)
          reply_error(res, 413, "the request body is larger than this server accepts");
        else if (res.status == 400 &&
                 req.get_header_value("Content-Type").rfind("multipart/form-data", 0) == 0)
          // httplib refuses a multipart body it cannot split before any route sees it.
          reply_error(res, 400,
                      "the multipart/form-data body of " + req.method + " " + req.path +
                          " could not be read: every part must start with the boundary given in "
                          "Content-Type ('" +
                          req.get_header_value("Content-Type") +
                          "') and the body must end with it followed by '--'");
        else
          reply_error(
              res, res.status,
              "HTTP error " + std::to_string(res.status) + " on " + req.method + " " + req.path);
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string message = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          message = e.what();
        } catch (...) {
        }
        reply_error(res, 500, message);
      });

  add_web_routes(svr);
  add_native_routes(svr, *state_);
  add_a1111_routes(svr, *state_);
  add_openai_routes(svr, *state_);
}

HttpServer::~HttpServer() {
  stop(true);
}

int HttpServer::bind() {
  const auto& o = state_->options;
  const std::string host = o.host == "localhost" ? "127.0.0.1" : o.host;
  if (o.port == 0) {
    port_ = http_->bind_to_any_port(host);
  } else {
    port_ = http_->bind_to_port(host, o.port) ? o.port : -1;
  }
  if (port_ < 0)
    throw IoError("cannot listen on " + o.host + ":" + std::to_string(o.port) +
                  " (address in use, or not an address of this machine)");
  widen_listen_backlog(port_);
  return port_;
}

void HttpServer::serve() {
  if (port_ < 0) bind();
  http_->listen_after_bind();
}

void HttpServer::stop(bool cancel_running) {
  state_->queue.shutdown(cancel_running);
  http_->stop();
}

bool HttpServer::running() const {
  return http_->is_running();
}

}  // namespace diffuse::server
