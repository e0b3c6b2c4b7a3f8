// SHA-256 of a file (OpenSSL's libcrypto), for checking files against the digests a manifest
// lists (golden sets' cases.json "files").
#pragma once
#include <string>

namespace diffuse::io {

// Lower-case hex digest of the file's bytes; IoError if it cannot be read.
std::string sha256_file_hex(const std::string& path);
// Of a byte string (tests, small data).
std::string sha256_hex(const std::string& bytes);

}  // namespace diffuse::io
