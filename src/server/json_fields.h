// Typed reading of a JSON request body: every field is checked for its type and range, and the
// error names the field, what was expected and what came ("steps: expected an integer in
// [1, 150], got \"ten\"").
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace diffuse::server {

// Parses a request body; InvalidArgument if it is not JSON, nests deeper than 32 levels, or
// (when object_required) is not an object.
nlohmann::json parse_json_body(const std::string& body, bool object_required = true);

class JsonFields {
 public:
  explicit JsonFields(const nlohmann::json& object) : object_(object) {}

  bool has(const char* key) const;  // present and not null
  std::optional<std::string> string(const char* key, size_t max_chars);
  std::optional<int64_t> integer(const char* key, int64_t min, int64_t max);
  std::optional<double> number(const char* key, double min, double max);
  std::optional<bool> boolean(const char* key);
  // A string or an array of strings.
  std::optional<std::vector<std::string>> strings(const char* key, size_t max_items,
                                                  size_t max_chars);
  // Marks a field as known without reading it.
  void ignore(const char* key) { read_.insert(key); }
  // InvalidArgument naming the first field that was not read (strict APIs).
  void reject_unknown() const;
  // The fields that were not read (lenient APIs report them).
  std::vector<std::string> unknown() const;

 private:
  const nlohmann::json* get(const char* key);
  const nlohmann::json& object_;
  std::set<std::string> read_;
};

}  // namespace diffuse::server
