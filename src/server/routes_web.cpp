// The web page: / and its assets, from the copies embedded at build time.
#include <httplib.h>

#include "server/server_state.h"
#include "server/web_assets.h"

namespace diffuse::server {

void add_web_routes(httplib::Server& server) {
  for (const auto& asset : web_assets()) {
    const std::string path = asset.path;
    auto handler = [&asset](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_content(asset.data, asset.size, asset.mime);
    };
    server.Get(path, handler);
    if (path == "/index.html") server.Get("/", handler);
  }
  server.Get("/favicon.ico",
             [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
}

}  // namespace diffuse::server
