// A config.json with its file name attached, so every missing or mistyped key produces an
// error naming the file and the key. Unknown keys are ignored, as diffusers does.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "diffuse/errors.h"

namespace diffuse::io {

class JsonConfig {
 public:
  JsonConfig() = default;
  JsonConfig(nlohmann::json json, std::string source)
      : json_(std::move(json)), source_(std::move(source)) {}

  // Reads and parses a JSON file; IoError if missing, FormatError if malformed or not an object.
  static JsonConfig load(const std::string& path);

  const nlohmann::json& json() const { return json_; }
  const std::string& source() const { return source_; }
  bool has(const std::string& key) const { return json_.contains(key) && !json_[key].is_null(); }

  // The value of `key`, or ConfigError naming file and key if missing or of the wrong type.
  template <typename T>
  T require(const std::string& key) const {
    if (!has(key)) throw ConfigError(source_ + ": missing required key '" + key + "'");
    return convert<T>(key);
  }
  // The value of `key`, or `fallback` if the key is absent or null.
  template <typename T>
  T get(const std::string& key, const T& fallback) const {
    if (!has(key)) return fallback;
    return convert<T>(key);
  }
  template <typename T>
  std::optional<T> get_optional(const std::string& key) const {
    if (!has(key)) return std::nullopt;
    return convert<T>(key);
  }
  // A number that may be written as a string ("-inf", "inf", "nan") in strict-JSON files.
  double get_number(const std::string& key, double fallback) const;

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw ConfigError(source_ + ": key '" + key + "': " + problem);
  }

 private:
  template <typename T>
  T convert(const std::string& key) const {
    try {
      return json_.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
      fail(key, "has the wrong type (value: " + json_.at(key).dump() + ")");
    }
  }

  nlohmann::json json_ = nlohmann::json::object();
  std::string source_;
};

// A number as a message shows it: 0.5, 1e-06, 1000 (what `os << v` prints).
std::string number_text(double v);

}  // namespace diffuse::io
