#include "server/json_fields.h"

#include <cmath>

#include "diffuse/errors.h"

namespace diffuse::server {
namespace {

constexpr int kMaxDepth = 32;

// A short rendering of a bad value for the error message.
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s + " (" + v.type_name() + ")";
}

std::string range(double min, double max) {
  auto f = [](double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  return "[" + f(min) + ", " + f(max) + "]";
}

}  // namespace

nlohmann::json parse_json_body(const std::string& body, bool object_required) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body, [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > kMaxDepth)
        throw InvalidArgument("request body nests deeper than " + std::to_string(kMaxDepth) +
                              " levels");
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(std::string("request body is not valid JSON: ") + e.what());
  }
  if (object_required && !j.is_object())
    throw InvalidArgument(std::string("request body must be a JSON object, got ") + j.type_name());
  return j;
}

const nlohmann::json* JsonFields::get(const char* key) {
  read_.insert(key);
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonFields::has(const char* key) const {
  auto it = object_.find(key);
  return it != object_.end() && !it->is_null();
}

std::optional<std::string> JsonFields::string(const char* key, size_t max_chars) {
  const auto* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_string())
    throw InvalidArgument(std::string(key) + ": expected a string, got " + shown(*v));
  const auto& s = v->get_ref<const std::string&>();
  if (s.size() > max_chars)
    throw InvalidArgument(std::string(key) + ": " + std::to_string(s.size()) +
                          " characters, at most " + std::to_string(max_chars) + " allowed");
  return s;
}

std::optional<int64_t> JsonFields::integer(const char* key, int64_t min, int64_t max) {
  const auto* v = get(key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw InvalidArgument(std::string(key) + ": expected an integer in " +
                            range(static_cast<double>(min), static_cast<double>(max)) + ", got " +
                            shown(*v));
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
             std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());  // 512.0 from clients that only have doubles
  } else {
    throw InvalidArgument(std::string(key) + ": expected an integer in " +
                          range(static_cast<double>(min), static_cast<double>(max)) + ", got " +
                          shown(*v));
  }
  if (x < min || x > max)
    throw InvalidArgument(std::string(key) + ": " + std::to_string(x) + " is out of range " +
                          range(static_cast<double>(min), static_cast<double>(max)));
  return x;
}

std::optional<double> JsonFields::number(const char* key, double min, double max) {
  const auto* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number())
    throw InvalidArgument(std::string(key) + ": expected a number in " + range(min, max) +
                          ", got " + shown(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < min || x > max)
    throw InvalidArgument(std::string(key) + ": " + v->dump() + " is out of range " +
                          range(min, max));
  return x;
}

std::optional<bool> JsonFields::boolean(const char* key) {
  const auto* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    throw InvalidArgument(std::string(key) + ": expected true or false, got " + shown(*v));
  return v->get<bool>();
}

std::optional<std::vector<std::string>> JsonFields::strings(const char* key, size_t max_items,
                                                            size_t max_chars) {
  const auto* v = get(key);
  if (!v) return std::nullopt;
  std::vector<std::string> out;
  auto take = [&](const nlohmann::json& item, const std::string& where) {
    if (!item.is_string()) throw InvalidArgument(where + ": expected a string, got " + shown(item));
    const auto& s = item.get_ref<const std::string&>();
    if (s.size() > max_chars)
      throw InvalidArgument(where + ": " + std::to_string(s.size()) + " characters, at most " +
                            std::to_string(max_chars) + " allowed");
    out.push_back(s);
  };
  if (v->is_string()) {
    take(*v, key);
  } else if (v->is_array()) {
    if (v->size() > max_items)
      throw InvalidArgument(std::string(key) + ": " + std::to_string(v->size()) +
                            " items, at most " + std::to_string(max_items) + " allowed");
    for (size_t i = 0; i < v->size(); ++i)
      take((*v)[i], std::string(key) + "[" + std::to_string(i) + "]");
  } else {
    throw InvalidArgument(std::string(key) + ": expected a string or an array of strings, got " +
                          shown(*v));
  }
  return out;
}

std::vector<std::string> JsonFields::unknown() const {
  std::vector<std::string> out;
  for (auto it = object_.begin(); it != object_.end(); ++it)
    if (!read_.count(it.key())) out.push_back(it.key());
  return out;
}

void JsonFields::reject_unknown() const {
  auto u = unknown();
  if (!u.empty()) throw InvalidArgument("unknown field '" + u[0] + "'");
}

}  // namespace diffuse::server
