#include "io/json_config.h"
#include "io/input_file.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace diffuse::io {

JsonConfig JsonConfig::load(const std::string& path) {
  require_regular_file(path, "JSON file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(path + ": invalid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw FormatError(path + ": expected a JSON object at the top level");
  return JsonConfig(std::move(j), path);
}

double JsonConfig::get_number(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  const auto& v = json_.at(key);
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s == "-inf" || s == "-Infinity") return -std::numeric_limits<double>::infinity();
    if (s == "inf" || s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "nan" || s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  }
  fail(key, "expected a number, got " + v.dump());
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace diffuse::io
