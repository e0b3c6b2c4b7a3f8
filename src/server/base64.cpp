#include "server/base64.h"

#include <array>
#include <cstdint>

#include "diffuse/errors.h"

namespace diffuse::server {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::array<int8_t, 256> decode_table() {
  std::array<int8_t, 256> t{};
  t.fill(-1);
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  t['-'] = 62;  // URL-safe alphabet
  t['_'] = 63;
  return t;
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                 (static_cast<uint8_t>(bytes[i + 1]) << 8) | static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(std::string_view text, const std::string& what) {
  static const auto table = decode_table();
  size_t start = 0;
  if (text.substr(0, 5) == "data:") {
    const size_t comma = text.find(',');
    if (comma == std::string_view::npos ||
        text.substr(0, comma).find(";base64") == std::string_view::npos)
      throw InvalidArgument(what + ": a data URL must be base64 (data:<type>;base64,<data>)");
    start = comma + 1;
  }
  std::string out;
  out.reserve((text.size() - start) / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t padding = 0;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (is_space(c)) continue;
    if (c == '=') {
      ++padding;
      continue;
    }
    const int8_t v = table[static_cast<unsigned char>(c)];
    if (v < 0 || padding > 0)
      throw InvalidArgument(what + ": invalid base64 " +
                            (v < 0 ? "character" : "data after '=' padding") + " at offset " +
                            std::to_string(i));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  // 6 leftover bits cannot come from whole bytes; padding must complete a 4-character group.
  if (bits >= 6 || padding > 2)
    throw InvalidArgument(what + ": truncated or over-padded base64 data");
  if (out.empty()) throw InvalidArgument(what + ": empty base64 data");
  return out;
}

}  // namespace diffuse::server
