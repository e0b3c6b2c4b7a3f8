// `diffuse bench gemm`: the bf16 linear-layer products of the models' text encoders and
// denoisers on this CPU, timed through our AVX512-BF16 kernel (nn/cpu_bf16_linear.h) and
// through LibTorch's oneDNN side by side in one run, with the largest difference between the
// two against what bf16 rounding allows; then a whole CLIP text encoder forward (SD2.1's
// OpenCLIP-H, or the --arch's) under each path: the stage issue 36 found slower than diffusers.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace diffuse::bench {

struct GemmBenchOptions {
  std::string arch = "sd2.1-base";  // whose text encoder runs whole
  int batch = 2;                    // prompts per text-encoder forward (CFG: 2)
  double min_seconds = 0.2;         // per shape and path, after a warm-up call
  std::function<void(const std::string&)> log;
};

struct GemmBenchRow {
  std::string model, layer;  // e.g. "CLIP-H text", "mlp.fc1"
  int64_t m = 0, n = 0, k = 0;
  double own_s = 0, onednn_s = 0;
  double own_gflops = 0, onednn_gflops = 0;
  // max |own - oneDNN| / (2^-8 * max |result| + the float32 sums' own error): <= 2 means the
  // two agree to bf16 rounding of each result.
  double diff_in_rounding = 0;
  bool auto_takes_own = false;  // what the automatic policy sends this shape to
};

struct GemmBenchResult {
  bool available = false;  // this CPU/build has the kernel (AVX512-BF16)
  std::string why_not, cpu;
  int threads = 0;
  std::vector<GemmBenchRow> rows;
  std::string text_model;  // the text encoder run whole
  int text_tokens = 0;
  double text_own_s = 0, text_onednn_s = 0;
  double text_max_abs_diff = 0, text_max_abs = 0;  // last hidden state, own vs oneDNN
};

GemmBenchResult run_gemm_bench(const GemmBenchOptions& options);

}  // namespace diffuse::bench
