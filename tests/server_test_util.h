// A diffuse server on a free loopback port with the demo model (or another engine), in this
// process, and a client for it: for the API tests and the load test.
#pragma once
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "diffuse/image.h"
#include "server/base64.h"
#include "server/http_server.h"
#include "server/sd_engine.h"
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
  explicit TestServer(server::ServerOptions options = {})
      : TestServer(demo_engine(), std::move(options)) {}
  TestServer(server::Engine& engine, server::ServerOptions options) {
    options.port = 0;
    http_ = std::make_unique<server::HttpServer>(engine, options);
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

// Sends `request` as written on one connection to 127.0.0.1:port and returns everything the
// server answers until it closes the connection (or 30 s pass without a byte): for requests
// httplib's client will not send, such as a POST without Content-Length.
inline std::string raw_http_exchange(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "socket failed";
  timeval timeout{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
      reply.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return reply;
}

inline nlohmann::json json_of(const httplib::Result& r) {
  if (!r) return nlohmann::json();
  return nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
}

// The Server-Sent Events of a job until its stream closes: (event name, data JSON).
inline std::vector<std::pair<std::string, nlohmann::json>> read_events(httplib::Client& c,
                                                                       const std::string& id) {
  std::string text;
  auto r = c.Get("/v1/jobs/" + id + "/events", [&](const char* data, size_t n) {
    text.append(data, n);
    return true;
  });
  EXPECT_TRUE(r) << "event stream failed";
  // Blocks of "event: NAME\ndata: JSON\n\n", read line by line (std::regex recurses per
  // character and overflows the stack on the ~100 KB events of a large job's previews).
  std::vector<std::pair<std::string, nlohmann::json>> events;
  std::string name;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    if (end == std::string::npos) break;  // a line the stream cut off
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("event: ", 0) == 0) {
      name = line.substr(7);
    } else if (line.rfind("data: ", 0) == 0 && !name.empty()) {
      events.emplace_back(name, nlohmann::json::parse(line.substr(6)));
      name.clear();
    }
  }
  return events;
}

inline nlohmann::json finished_job(httplib::Client& c, const std::string& id) {
  auto events = read_events(c, id);
  EXPECT_FALSE(events.empty());
  EXPECT_EQ(events.back().first, "done");
  return json_of(c.Get("/v1/jobs/" + id));
}

inline Image image_at(httplib::Client& c, const std::string& url,
                      std::map<std::string, std::string>* text = nullptr) {
  auto r = c.Get(url);
  EXPECT_TRUE(r && r->status == 200) << url;
  EXPECT_EQ(r->get_header_value("Content-Type"), "image/png");
  return decode_png(r->body, url, 1 << 24, text);
}

// Every error has the same shape and says something.
inline void expect_error(const httplib::Result& r, int status, const std::string& fragment) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, status) << r->body;
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  const std::string message = j["error"]["message"].get<std::string>();
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
  EXPECT_EQ(j["detail"], message);
}

inline std::string demo_png_base64(int w, int h) {
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.assign(static_cast<size_t>(w) * h * 3, 0);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      auto* p = &img.rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = x < w / 2 ? 220 : 30;
      p[1] = 200;
      p[2] = y < h / 2 ? 30 : 220;
    }
  return server::base64_encode(encode_png(img));
}

}  // namespace diffuse::test
