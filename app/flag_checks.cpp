#include "flag_checks.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "diffuse/errors.h"
#include "io/string_split.h"

namespace diffuse::app {

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& value) {
        return value.empty() ? std::string(
                                   "an empty value is not allowed (leave the flag out "
                                   "for the default)")
                             : std::string();
      },
      "NON-EMPTY");
}

CLI::Validator int_range(int64_t lo, int64_t hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& value) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
          return "expected " + what + ": an integer in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got '" + value + "'";
        return "";
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator number_range(double lo, double hi, const std::string& what) {
  std::ostringstream bounds;
  bounds << "[" << lo << ", " << hi << "]";
  return CLI::Validator(
      [lo, hi, what, range = bounds.str()](std::string& value) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || errno == ERANGE || !(v >= lo && v <= hi))
          return "expected " + what + ": a number in " + range + ", got '" + value + "'";
        return "";
      },
      "NUMBER in " + bounds.str());
}

uint64_t parse_seed(const std::string& text, const std::string& flag) {
  const bool digits_only =
      !text.empty() && text.size() <= 20 &&
      std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = digits_only ? std::strtoull(text.c_str(), &end, 10) : 0;
  if (!digits_only || *end != '\0' || errno == ERANGE)
    throw InvalidArgument(flag + " '" + text +
                          "': expected an integer in [0, 18446744073709551615] (2^64 - 1)");
  return static_cast<uint64_t>(v);
}

std::pair<int, int> parse_int_pair(const std::string& text, char sep, int lo, int hi,
                                   const std::string& flag) {
  const auto fields = io::split_fields(text, sep);
  std::vector<int> v;
  for (const auto& field : fields) {
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(field.c_str(), &end, 10);
    if (field.empty() || *end != '\0' || errno == ERANGE || n < lo || n > hi) break;
    v.push_back(static_cast<int>(n));
  }
  if (fields.size() != 2 || v.size() != 2)
    throw InvalidArgument(flag + ": expected two integers in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "] written A" + std::string(1, sep) + "B, got '" +
                          text + "'");
  return {v[0], v[1]};
}

}  // namespace diffuse::app
