// Readers for the config.json value shapes diffusers accepts: "an int, or one per block",
// "a bool, or one per block", string lists. Errors name the file and key (ConfigError).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace diffuse::models {

// `key` as a list of positive ints; ConfigError if missing (when required) or malformed.
std::vector<int64_t> read_int_list(const io::JsonConfig& cfg, const std::string& key);
// `key` as an int repeated n times or a list of exactly n ints; `fallback` if absent.
std::vector<int64_t> read_per_block_ints(const io::JsonConfig& cfg, const std::string& key,
                                         size_t n, int64_t fallback);
std::vector<bool> read_per_block_bools(const io::JsonConfig& cfg, const std::string& key, size_t n,
                                       bool fallback);
std::vector<std::string> read_string_list(const io::JsonConfig& cfg, const std::string& key,
                                          const std::vector<std::string>& fallback);
// An int or [h, w] (sample_size); empty if absent.
std::vector<int64_t> read_size(const io::JsonConfig& cfg, const std::string& key);
// ConfigError unless `key` is absent or null: for features this engine does not implement.
void reject_if_set(const io::JsonConfig& cfg, const std::string& key, const std::string& what);

}  // namespace diffuse::models
