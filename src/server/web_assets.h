// The web page's files (src/server/web), embedded in the binary at build time.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace diffuse::server {

struct WebAsset {
  const char* path;  // "/index.html"
  const char* mime;
  const char* data;
  size_t size;
};

const std::vector<WebAsset>& web_assets();

}  // namespace diffuse::server
