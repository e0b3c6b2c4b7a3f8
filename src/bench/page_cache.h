// How much of a set of files the OS page cache holds, so a measured load can say whether it
// read the weights from disk (cold) or from memory (warm).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::bench {

struct PageCacheState {
  int64_t bytes = 0;           // size of the files
  int64_t resident_bytes = 0;  // of which in the page cache (whole pages)
  double fraction() const { return bytes > 0 ? static_cast<double>(resident_bytes) / bytes : 0; }
};

// mincore() over a read-only mapping of each file; a file that cannot be opened is skipped, one
// that cannot be mapped counts with its size and nothing resident.
PageCacheState page_cache_state(const std::vector<std::string>& files);

// The weight files of a model: `path` itself when it is a file, else every *.safetensors,
// *.bin, *.ckpt and *.pt under the folder.
std::vector<std::string> weight_files(const std::string& path);

}  // namespace diffuse::bench
