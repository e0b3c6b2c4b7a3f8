// Checks for flag values that CLI11 would otherwise take silently: an explicitly empty
// string (--device ''), a zero or negative size, a seed outside uint64.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <utility>

namespace diffuse::app {

// Refuses an explicitly empty value: '' never means "the default" on our command lines.
CLI::Validator non_empty();
// An integer in [lo, hi] (CLI11's own Range prints the bounds but not what they are for).
CLI::Validator int_range(int64_t lo, int64_t hi, const std::string& what);
// A finite number in [lo, hi] (CLI11's Range lets NaN through: every comparison with it is false).
CLI::Validator number_range(double lo, double hi, const std::string& what);
// A seed: the full uint64 range, as torch's manual_seed takes it; anything else (negative,
// beyond 2^64-1, not an integer) is an InvalidArgument naming `flag`.
uint64_t parse_seed(const std::string& text, const std::string& flag);
// Two integers in [lo, hi] separated by `sep` ("1024x768", "0,64"); InvalidArgument naming
// `flag` and the form expected otherwise.
std::pair<int, int> parse_int_pair(const std::string& text, char sep, int lo, int hi,
                                   const std::string& flag);

}  // namespace diffuse::app
