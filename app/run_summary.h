// The summary a generating command prints at its end: `--json` on stdout, or the timings line
// on stderr. One shape for every family (Stable Diffusion, HiDream), so scripts read one format.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "diffuse/pipeline.h"

namespace diffuse::app {

struct RunSummary {
  std::vector<std::string> files;
  uint64_t seed = 0;
  std::string device, dtype, vae_dtype, attention, scheduler;
  double load_s = 0;
  int64_t weight_bytes = 0;
  std::vector<std::string> loras;
  std::vector<StageTimings> runs;  // one per generation of the command

  nlohmann::json json() const;
  // "timings: load 1.2 s, text encode ..., total ...; peak memory ... (seed S)", the memory per
  // stage and the CPU-share note, on stderr. `vae_encode`: whether the runs encoded an image.
  void print(bool vae_encode) const;
};

}  // namespace diffuse::app
