// `diffuse bench attention`: time and peak memory of every attention backend on the shapes
// people compare (seq 256/512/1024, hidden 768, 12 heads) and on Stable Diffusion 2.1's
// (self-attention over 64x64 / 96x96 latent tokens, cross-attention to 77 text tokens).
#pragma once
#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

#include "nn/attention.h"

namespace diffuse::bench {

struct AttentionCase {
  std::string name;
  int64_t batch, heads, nq, nk, head_dim;
  bool causal = false;
};

// "table": the common comparison table; "sd": SD2.1 at 512 and 768 px; "all": both.
std::vector<AttentionCase> attention_cases(const std::string& set);

struct AttentionBenchOptions {
  std::string device = "cpu";
  std::vector<torch::Dtype> dtypes{torch::kFloat32, torch::kBFloat16};
  std::vector<nn::AttentionBackend> backends;  // empty = every backend available on the device
  int repeat = 3;                              // timed calls (after one warm-up) at most
  double max_seconds = 3.0;                    // stop repeating a case after this much time
  double max_memory_gb = 8.0;                  // skip math cases whose scores would exceed this
  std::function<void(const std::string&)> log;
};

struct AttentionBenchRow {
  AttentionCase c;
  std::string dtype, backend;
  std::string kernel;  // flash: the CPU kernel used
  bool skipped = false;
  std::string note;          // why skipped
  double seconds = 0;        // best timed call
  double gflops = 0;         // 4 * B * H * Nq * Nk * D / seconds
  double peak_extra_mb = 0;  // peak RSS during the call above the RSS before it
};

std::vector<AttentionBenchRow> run_attention_bench(const std::vector<AttentionCase>& cases,
                                                   const AttentionBenchOptions& options);

}  // namespace diffuse::bench
