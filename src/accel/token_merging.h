// Token Merging for Stable Diffusion (Bolya & Hoffman 2023, "ToMe for SD"): bipartite soft
// matching on a self-attention's input tokens. Destinations are one random position in each
// 2x2 cell of the token grid; every other token is a source. The r sources most similar
// (cosine) to their best destination are averaged into it; attn1 runs on the remaining
// tokens; afterwards each merged source takes its destination's output (unmerge by copying).
#pragma once
#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "diffuse/pipeline.h"
#include "models/unet2d_condition.h"
#include "nn/token_merge_hook.h"

namespace diffuse::accel {

// One matching: indices into the token dimension of [B, N, C] tensors.
struct TokenMatch {
  int64_t tokens = 0;         // N
  torch::Tensor src_pos;      // [S] positions of the sources (everything but destinations)
  torch::Tensor dst_pos;      // [D] positions of the destinations, one per 2x2 cell
  torch::Tensor unmerged;     // [B, S - r] source indices (into src_pos) that stay
  torch::Tensor merged;       // [B, r] source indices that are merged
  torch::Tensor merged_into;  // [B, r] the destination (into dst_pos) each one joins
  int64_t merged_count() const { return merged.defined() ? merged.size(1) : 0; }
};

// Matches the tokens of `metric` [B, height*width, C] (row-major grid): r = floor(N * ratio)
// sources, at most all of them. The random destinations come from `gen` (CPU), one draw of
// (height/2)*(width/2) integers per call; cells cut off by an odd side hold only sources.
TokenMatch match_tokens(const torch::Tensor& metric, int64_t height, int64_t width, double ratio,
                        at::Generator& gen);
// [B, N, C] -> [B, N - r, C]: kept sources, then destinations averaged with what joined them.
torch::Tensor merge_tokens(const TokenMatch& match, const torch::Tensor& x);
// [B, N - r, C] -> [B, N, C]: every token back in its place, merged sources copying their
// destination.
torch::Tensor unmerge_tokens(const TokenMatch& match, const torch::Tensor& y);

// InvalidArgument unless ratio is in [0, 1).
void validate_token_merging(const TokenMergingOptions& options);
// The transformer names ToMe applies to on this UNet: options.layers (each checked to exist),
// or by default the first two transformers of the first down block that has attention and
// the last two of the last up block that has (down_blocks.0 and up_blocks.3 on SD 2.x).
std::set<std::string> token_merging_sites(const TokenMergingOptions& options,
                                          const models::UNet2DConditionConfig& unet);

// The hook that the UNet's transformers consult (nn::TokenMergeHook) during one generation.
class TokenMerging : public nn::TokenMergeHook {
 public:
  TokenMerging(double ratio, std::set<std::string> sites, uint64_t seed);
  std::optional<nn::TokenMergePlan> plan(const std::string& site, int64_t block,
                                         const torch::Tensor& x, int64_t height,
                                         int64_t width) override;

 private:
  double ratio_;
  std::set<std::string> sites_;
  at::Generator gen_;
};

}  // namespace diffuse::accel
