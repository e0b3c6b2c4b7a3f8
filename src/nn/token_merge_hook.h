// A seam through which an accelerator (accel/token_merging) shrinks the token set of the
// UNet's self-attentions without the blocks knowing how: Transformer2DModel asks the hook in
// effect on this thread for a plan per transformer block, BasicTransformerBlock applies it
// around attn1. No hook (the default) leaves every block exactly as it was.
#pragma once
#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>

namespace diffuse::nn {

// merge: [B, N, C] -> [B, M, C] with M <= N; unmerge: [B, M, C] -> [B, N, C].
struct TokenMergePlan {
  std::function<torch::Tensor(const torch::Tensor&)> merge;
  std::function<torch::Tensor(const torch::Tensor&)> unmerge;
};

class TokenMergeHook {
 public:
  virtual ~TokenMergeHook() = default;
  // site: the Transformer2DModel's module name ("down_blocks.0.attentions.1"); block: the index
  // in its transformer_blocks; x: the block's input tokens [B, height*width, C], row-major.
  // nullopt = leave this block alone.
  virtual std::optional<TokenMergePlan> plan(const std::string& site, int64_t block,
                                             const torch::Tensor& x, int64_t height,
                                             int64_t width) = 0;
};

// The hook in effect on this thread, or nullptr. A thread-local rather than a forward argument
// because it must pass through every UNet block's signature to reach the transformers; the
// generation runs on one thread, so the scope is exactly one UNet call sequence.
TokenMergeHook* active_token_merge_hook();

class ScopedTokenMergeHook {
 public:
  explicit ScopedTokenMergeHook(TokenMergeHook* hook);
  ~ScopedTokenMergeHook();
  ScopedTokenMergeHook(const ScopedTokenMergeHook&) = delete;
  ScopedTokenMergeHook& operator=(const ScopedTokenMergeHook&) = delete;

 private:
  TokenMergeHook* previous_;
};

}  // namespace diffuse::nn
