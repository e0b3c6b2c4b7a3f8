// Readers for the config.json value shapes diffusers accepts: "an int, or one per block",
// "a bool, or one per block", string lists. Errors name the file and key (ConfigError).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace diffuse::models {

// Upper bounds for the sizes a config.json gives: every module is built (and its memory
// allocated) from the config before a weight is read, so a typo like layers_per_block 1e9 must
// fail here, naming the key, instead of in the allocator. Real models are far inside them.
constexpr int64_t kMaxConfigDim = int64_t{1} << 17;    // channels, hidden and FFN sizes, heads
constexpr int64_t kMaxConfigLayers = 512;              // layers (per block or in all)
constexpr int64_t kMaxConfigVocab = int64_t{1} << 21;  // token embeddings
constexpr int64_t kMaxConfigPositions = int64_t{1} << 20;
constexpr int64_t kMaxImageSide = 8192;  // pixels (a VAE's sample_size), as --width/--height

// An integer in [lo, hi], or `fallback` if absent; ConfigError naming the file, key, value and
// range otherwise.
int64_t read_int_in(const io::JsonConfig& cfg, const std::string& key, int64_t fallback, int64_t lo,
                    int64_t hi);
// A finite number in [lo, hi] (or (0, hi] when lo is 0 and positive is set), or `fallback`.
double read_number_in(const io::JsonConfig& cfg, const std::string& key, double fallback, double lo,
                      double hi);
double read_positive_number(const io::JsonConfig& cfg, const std::string& key, double fallback,
                            double hi);

// `key` as a list of ints in [1, max]; ConfigError if missing (when required) or malformed.
std::vector<int64_t> read_int_list(const io::JsonConfig& cfg, const std::string& key,
                                   int64_t max = kMaxConfigDim);
// `key` as an int repeated n times or a list of exactly n ints in [1, max]; `fallback` if
// absent.
std::vector<int64_t> read_per_block_ints(const io::JsonConfig& cfg, const std::string& key,
                                         size_t n, int64_t fallback, int64_t max = kMaxConfigDim);
std::vector<bool> read_per_block_bools(const io::JsonConfig& cfg, const std::string& key, size_t n,
                                       bool fallback);
std::vector<std::string> read_string_list(const io::JsonConfig& cfg, const std::string& key,
                                          const std::vector<std::string>& fallback);
// An int or [h, w] (sample_size), each in [1, max]; empty if absent.
std::vector<int64_t> read_size(const io::JsonConfig& cfg, const std::string& key, int64_t max);
// ConfigError unless `key` is absent or null: for features this engine does not implement.
void reject_if_set(const io::JsonConfig& cfg, const std::string& key, const std::string& what);

}  // namespace diffuse::models
