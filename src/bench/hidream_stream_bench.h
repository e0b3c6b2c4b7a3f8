// `diffuse bench hidream-stream -m DIR`: one full-size HiDream transformer step (both guidance
// branches in one batch) from a model folder on disk, streamed or resident, with load time,
// step time and peak resident memory measured in the same run (make DIR with
// `diffuse create-demo-model --arch hidream-i1`).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace diffuse::bench {

struct HiDreamStreamBenchOptions {
  std::string model;  // a folder with transformer/
  std::string device = "auto", dtype = "auto";
  std::string stream = "auto";  // auto|on|off, as HiDreamPipeline::set_weight_streaming
  int width = 1024, height = 1024;
  int batch = 2;          // 2 = one image with classifier-free guidance
  int text_tokens = 128;  // T5 and Llama tokens each
  uint64_t seed = 0;
  std::function<void(const std::string&)> log;
};

struct HiDreamStreamBenchResult {
  std::string device, dtype;
  bool streamed = false, zero_copy = false;
  double weights_gib = 0, streamed_gib = 0, available_gib = 0;
  double load_s = 0, step_s = 0;
  double load_peak_rss_gib = 0, step_peak_rss_gib = 0;
  int image_tokens = 0;
};

HiDreamStreamBenchResult run_hidream_stream_bench(const HiDreamStreamBenchOptions& options);

}  // namespace diffuse::bench
