// Splitting the specs of flags and request fields ("3:0:0", "fbcache:0.1:2") into their fields.
#pragma once
#include <string>
#include <vector>

namespace diffuse::io {

// Every field between separators, empty ones included: "a::b" -> {"a", "", "b"}, "" -> {""}.
inline std::vector<std::string> split_fields(const std::string& s, char sep) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t at; (at = s.find(sep, start)) != std::string::npos; start = at + 1)
    fields.push_back(s.substr(start, at - start));
  fields.push_back(s.substr(start));
  return fields;
}

}  // namespace diffuse::io
