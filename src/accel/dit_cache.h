// DiT caches (DitCacheOptions in diffuse/pipeline.h): the state one generation keeps between its
// denoising steps, and the decisions a transformer's forward asks of it. The transformer calls
// it at fixed points (before and after each block, after the first block, before the final
// layer), so any DiT with dual- and/or single-stream blocks reuses it as it is.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "diffuse/pipeline.h"

namespace diffuse::accel {

// "off", "fbcache[:THRESHOLD]", "taylorseer[:INTERVAL[:ORDER]]", "ditcache[:FIRST:LAST[:INTERVAL]]"
// (the --cache flag and the server's "cache" field); InvalidArgument naming `what`, the value
// and what is expected.
DitCacheOptions parse_dit_cache(const std::string& spec, const std::string& what = "--cache");
// The spec back, with every value (for run records).
std::string dit_cache_spec(const DitCacheOptions& options);
// The ranges that need no model; InvalidArgument naming the field.
void validate_dit_cache(const DitCacheOptions& options);
// A UNet model refuses every method but off: InvalidArgument saying which models the caches
// serve and what a UNet has instead.
void refuse_dit_cache_on_unet(const DitCacheOptions& options, const std::string& what = "--cache");

// What a cache skipped over a generation.
struct DitCacheStats {
  int full_calls = 0, cached_calls = 0;  // denoiser calls that ran every block / skipped some
  int64_t blocks_run = 0, blocks_possible = 0;
  DitCacheStats& operator+=(const DitCacheStats& o) {
    full_calls += o.full_calls;
    cached_calls += o.cached_calls;
    blocks_run += o.blocks_run;
    blocks_possible += o.blocks_possible;
    return *this;
  }
};

// One line for the user: "cache SPEC: N of M steps skipped blocks, K of L blocks ran".
std::string dit_cache_summary(const DitCacheOptions& options, const DitCacheStats& stats);

class DitCache {
 public:
  // `dual_blocks` and `single_blocks`: the model's; the block range is resolved and checked
  // against them (InvalidArgument).
  DitCache(const DitCacheOptions& options, int64_t dual_blocks, int64_t single_blocks);

  // Before the denoiser call of step `step` (0-based) of `total`. Calls of one step (a batch
  // holding every guidance branch) share it.
  void begin_step(int step, int total);
  // At the start of each forward with the image tokens it embeds: a call of another shape
  // (E1's refine phase, another batch) starts the cache afresh.
  void begin_call(const torch::Tensor& image_tokens);

  // TaylorSeer: whether this call's final image features are forecast (no block runs).
  bool forecasts() const;
  torch::Tensor forecast();

  // Block schedule: whether block `index` starts the range and this call adds its residual
  // instead of running it; then apply_range() gives the range's outputs and range_last() the
  // block after which to go on.
  bool reuses_range_at(int64_t index) const;
  std::vector<torch::Tensor> apply_range(const std::vector<torch::Tensor>& inputs);
  int64_t range_last() const { return last_; }
  // Around every block that runs (counted): the range's inputs and residual are kept.
  void before_block(int64_t index, const std::vector<torch::Tensor>& inputs);
  void after_block(int64_t index, const std::vector<torch::Tensor>& outputs);

  // First-Block Cache: after the first block, with its residual on the image tokens. True:
  // skip the other blocks and add remaining_residual() to the first block's image output.
  bool reuse_after_first_block(const torch::Tensor& first_residual);
  // Split over ranks, each rank sees a share of the tokens (sequence parallelism) and/or of the
  // batch (CFG-parallel), but all must decide alike: the First-Block Cache then adds its sums
  // over the token shares (set_rank_sum, by the transformer) and over the batch shares
  // (set_branch_sum, by the pipeline), which gives every rank one device's numbers.
  using RankSum = std::function<std::vector<double>(const std::vector<double>&)>;
  void set_rank_sum(RankSum sum) { rank_sum_ = std::move(sum); }
  void set_branch_sum(RankSum sum) { branch_sum_ = std::move(sum); }
  torch::Tensor remaining_residual() const { return remaining_; }
  bool first_block_cache() const { return options_.method == DitCacheOptions::Method::kFirstBlock; }

  // The final image features of a call that computed them (before the final layer), and the
  // first block's image output where the first-block cache ran the rest.
  void record_final(const torch::Tensor& features, const torch::Tensor& after_first_block);

  // What ran: denoiser calls in full, and calls that skipped blocks (forecast or reused).
  int full_calls() const { return calls_ - cached_calls_; }
  int cached_calls() const { return cached_calls_; }
  // Blocks run, and blocks full calls would have run, over all calls so far.
  int64_t blocks_run() const { return blocks_run_; }
  int64_t blocks_possible() const { return blocks_possible_; }
  DitCacheStats stats() const {
    return {full_calls(), cached_calls(), blocks_run_, blocks_possible_};
  }
  const DitCacheOptions& options() const { return options_; }

 private:
  bool full_step() const;  // TaylorSeer and the block schedule: a step that computes
  void mark_cached();
  void reset();

  DitCacheOptions options_;
  int64_t blocks_ = 0, first_ = -1, last_ = -1;
  int step_ = 0, total_ = 0;
  std::vector<int64_t> shape_;
  bool call_cached_ = false;

  // First-Block Cache.
  torch::Tensor first_residual_, remaining_;
  RankSum rank_sum_, branch_sum_;
  // TaylorSeer: the last full step's features and their derivatives (per step), and its index.
  std::vector<torch::Tensor> taylor_;
  int taylor_step_ = -1;
  // Block schedule.
  std::vector<torch::Tensor> range_inputs_, range_residuals_;

  int calls_ = 0, cached_calls_ = 0;
  torch::Dtype feature_dtype_ = torch::kFloat32;
  int64_t blocks_run_ = 0, blocks_possible_ = 0;
};

}  // namespace diffuse::accel
