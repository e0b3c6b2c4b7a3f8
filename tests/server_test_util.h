// A diffuse server on a free loopback port with the demo model, in this process, and a client
// for it: for the API tests and the load test.
#pragma once
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/http_server.h"
#include "server/server_state.h"

namespace diffuse::test {

inline std::string demo_model_dir() {
  return std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";
}

// The demo model loaded once per process (every server of a test shares it).
inline server::SdEngine& demo_engine() {
  static server::SdEngine* engine = [] {
    LoadOptions lo;
    lo.device = "cpu";
    return new server::SdEngine(demo_model_dir(), lo);  // lives until exit
  }();
  return *engine;
}

class TestServer {
 public:
  explicit TestServer(server::ServerOptions options = {}) {
    options.port = 0;
    http_ = std::make_unique<server::HttpServer>(demo_engine(), options);
    port_ = http_->bind();
    thread_ = std::thread([this] { http_->serve(); });
  }
  ~TestServer() {
    http_->stop(true);
    thread_.join();
  }
  int port() const { return port_; }
  server::HttpServer& http() { return *http_; }
  server::JobQueue& queue() { return http_->state().queue; }
  // A new client (httplib clients are not shared between threads).
  std::unique_ptr<httplib::Client> client(const std::string& api_key = "") const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(300);
    c->set_write_timeout(60);
    if (!api_key.empty()) c->set_bearer_token_auth(api_key.c_str());
    return c;
  }

 private:
  std::unique_ptr<server::HttpServer> http_;
  int port_ = 0;
  std::thread thread_;
};

inline nlohmann::json json_of(const httplib::Result& r) {
  if (!r) return nlohmann::json();
  return nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
}

}  // namespace diffuse::test
