// Base64 (RFC 4648) for images inside JSON requests and responses.
#pragma once
#include <string>
#include <string_view>

namespace diffuse::server {

std::string base64_encode(std::string_view bytes);

// Strict decoding of the standard or URL-safe alphabet; a "data:...;base64," prefix and
// whitespace are skipped, padding is optional. Throws InvalidArgument naming `what` and the
// offset of the first bad character. Output is at most 3/4 of the input size.
std::string base64_decode(std::string_view text, const std::string& what);

}  // namespace diffuse::server
