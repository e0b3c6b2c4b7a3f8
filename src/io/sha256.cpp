#include "io/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "diffuse/errors.h"
#include "io/input_file.h"

namespace diffuse::io {
namespace {

struct DigestContext {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~DigestContext() { EVP_MD_CTX_free(ctx); }
};

std::string hex(const unsigned char* d, unsigned n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += digits[d[i] >> 4];
    out += digits[d[i] & 15];
  }
  return out;
}

template <typename Feed>
std::string digest(Feed&& feed) {
  DigestContext c;
  if (!c.ctx || EVP_DigestInit_ex(c.ctx, EVP_sha256(), nullptr) != 1)
    throw Error("SHA-256 is not available from libcrypto");
  feed(c.ctx);
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(c.ctx, d, &n);
  return hex(d, n);
}

}  // namespace

std::string sha256_hex(const std::string& bytes) {
  return digest([&](EVP_MD_CTX* ctx) { EVP_DigestUpdate(ctx, bytes.data(), bytes.size()); });
}

std::string sha256_file_hex(const std::string& path) {
  require_regular_file(path, "file");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw IoError("cannot open '" + path + "': " + std::strerror(errno));
  return digest([&](EVP_MD_CTX* ctx) {
    std::vector<unsigned char> buf(1 << 20);
    for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0;)
      EVP_DigestUpdate(ctx, buf.data(), n);
    if (std::ferror(f.get())) throw IoError("cannot read '" + path + "'");
  });
}

}  // namespace diffuse::io
