// `diffuse bench --arch t5-xxl | llama-3.1-8b`: HiDream's two large text encoders at full size
// with random weights (T5-XXL's encoder, 4.8B parameters; Llama-3.1-8B without its lm_head,
// 7.0B), one forward of the pipeline's batch at its 128 tokens, with parameter count, weight
// memory and peak RSS. A model whose weights would not fit in the memory available now is
// skipped with the numbers that say why.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace diffuse::bench {

bool is_text_encoder_arch(const std::string& name);  // "t5-xxl", "llama-3.1-8b"
// The hub config.json of google/t5-v1_1-xxl / meta-llama/Llama-3.1-8B-Instruct.
nlohmann::json text_encoder_arch_config(const std::string& name);

struct TextEncoderBenchOptions {
  std::string arch, device = "auto", dtype = "auto";
  int batch = 2, tokens = 128, repeat = 1;
  uint64_t seed = 0;
  std::function<void(const std::string&)> log;
};

struct TextEncoderBenchResult {
  std::string arch, device, dtype;
  int batch = 0, tokens = 0, threads = 0;
  double params_b = 0, weights_gib = 0;
  double available_gib = 0;  // MemAvailable when the bench started
  bool skipped = false;
  std::string skip_reason;
  double build_s = 0, best_s = 0, peak_gib = 0;
};

TextEncoderBenchResult run_text_encoder_bench(const TextEncoderBenchOptions& options);
nlohmann::json to_json(const TextEncoderBenchResult& r);

}  // namespace diffuse::bench
