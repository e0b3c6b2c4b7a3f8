#include "models/config_values.h"

#include <cmath>
#include <sstream>

namespace diffuse::models {
namespace {

int64_t as_positive_int(const io::JsonConfig& cfg, const std::string& key, const nlohmann::json& v,
                        int64_t max) {
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > max)
    cfg.fail(key, "expected an integer in [1, " + std::to_string(max) + "], got " + v.dump());
  return v.get<int64_t>();
}

}  // namespace

int64_t read_int_in(const io::JsonConfig& cfg, const std::string& key, int64_t fallback, int64_t lo,
                    int64_t hi) {
  if (!cfg.has(key)) return fallback;
  const auto& v = cfg.json()[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    cfg.fail(key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "], got " + v.dump());
  return v.get<int64_t>();
}

double read_number_in(const io::JsonConfig& cfg, const std::string& key, double fallback, double lo,
                      double hi) {
  const double v = cfg.get_number(key, fallback);
  if (!(std::isfinite(v) && v >= lo && v <= hi))
    cfg.fail(key, "expected a finite number in [" + io::number_text(lo) + ", " +
                      io::number_text(hi) + "], got " + io::number_text(v));
  return v;
}

double read_positive_number(const io::JsonConfig& cfg, const std::string& key, double fallback,
                            double hi) {
  const double v = cfg.get_number(key, fallback);
  if (!(std::isfinite(v) && v > 0 && v <= hi))
    cfg.fail(key, "expected a finite number in (0, " + io::number_text(hi) + "], got " +
                      io::number_text(v));
  return v;
}

std::vector<int64_t> read_int_list(const io::JsonConfig& cfg, const std::string& key, int64_t max) {
  if (!cfg.has(key)) throw ConfigError(cfg.source() + ": missing required key '" + key + "'");
  const auto& v = cfg.json()[key];
  if (!v.is_array() || v.empty())
    cfg.fail(key, "expected a non-empty list of integers, got " + v.dump());
  std::vector<int64_t> out;
  for (const auto& e : v) out.push_back(as_positive_int(cfg, key, e, max));
  return out;
}

std::vector<int64_t> read_per_block_ints(const io::JsonConfig& cfg, const std::string& key,
                                         size_t n, int64_t fallback, int64_t max) {
  if (!cfg.has(key)) return std::vector<int64_t>(n, fallback);
  const auto& v = cfg.json()[key];
  if (!v.is_array()) return std::vector<int64_t>(n, as_positive_int(cfg, key, v, max));
  if (v.size() != n)
    cfg.fail(key, "has " + std::to_string(v.size()) + " entries, expected one per block (" +
                      std::to_string(n) + "): " + v.dump());
  std::vector<int64_t> out;
  for (const auto& e : v) out.push_back(as_positive_int(cfg, key, e, max));
  return out;
}

std::vector<bool> read_per_block_bools(const io::JsonConfig& cfg, const std::string& key, size_t n,
                                       bool fallback) {
  if (!cfg.has(key)) return std::vector<bool>(n, fallback);
  const auto& v = cfg.json()[key];
  if (v.is_boolean()) return std::vector<bool>(n, v.get<bool>());
  if (!v.is_array() || v.size() != n)
    cfg.fail(key,
             "expected a boolean or a list of " + std::to_string(n) + " booleans, got " + v.dump());
  std::vector<bool> out;
  for (const auto& e : v) {
    if (!e.is_boolean()) cfg.fail(key, "expected booleans, got " + v.dump());
    out.push_back(e.get<bool>());
  }
  return out;
}

std::vector<std::string> read_string_list(const io::JsonConfig& cfg, const std::string& key,
                                          const std::vector<std::string>& fallback) {
  if (!cfg.has(key)) return fallback;
  const auto& v = cfg.json()[key];
  if (!v.is_array()) cfg.fail(key, "expected a list of strings, got " + v.dump());
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string()) cfg.fail(key, "expected a list of strings, got " + v.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<int64_t> read_size(const io::JsonConfig& cfg, const std::string& key, int64_t max) {
  if (!cfg.has(key)) return {};
  const auto& v = cfg.json()[key];
  if (v.is_array()) {
    if (v.size() != 2) cfg.fail(key, "expected an integer or [height, width], got " + v.dump());
    return {as_positive_int(cfg, key, v[0], max), as_positive_int(cfg, key, v[1], max)};
  }
  return {as_positive_int(cfg, key, v, max)};
}

void reject_if_set(const io::JsonConfig& cfg, const std::string& key, const std::string& what) {
  if (cfg.has(key))
    cfg.fail(key, what + " is not supported (value: " + cfg.json()[key].dump() + ")");
}

}  // namespace diffuse::models
