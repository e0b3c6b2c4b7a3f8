// The block loop of a DiT's forward with a DiT cache's hooks (accel/dit_cache.h): dual-stream
// blocks on {image, text}, then single-stream blocks on the joined tokens. The cache, when one
// is given, may forecast the whole call (TaylorSeer), add a range's kept residual instead of
// running it (block schedule), or stop after the first block (First-Block Cache). A family
// gives its blocks as functions (intermediates, weight streaming and how its text stream
// changes stay in them), so every DiT shares one loop and one set of cache semantics.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>

namespace diffuse::accel {

class DitCache;

struct DitBlockLoop {
  int64_t dual_blocks = 0, single_blocks = 0;
  // Dual-stream block i: (image, text) -> its (image, text).
  std::function<std::pair<torch::Tensor, torch::Tensor>(int64_t i, const torch::Tensor& image,
                                                        const torch::Tensor& text)>
      dual;
  // The joint sequence the single-stream blocks take, from the dual blocks' outputs.
  std::function<torch::Tensor(const torch::Tensor& image, const torch::Tensor& text)> join;
  // Single-stream block j (0-based among them): tokens -> its tokens.
  std::function<torch::Tensor(int64_t j, const torch::Tensor& tokens)> single;
  // The image tokens of a joint sequence.
  std::function<torch::Tensor(const torch::Tensor& tokens)> image_of;
};

// Runs the blocks from the embedded image and text tokens; returns the image features after
// the last block (what the final layer takes). `cache` may be null: every block runs.
torch::Tensor run_dit_blocks(const DitBlockLoop& loop, DitCache* cache, torch::Tensor image,
                             torch::Tensor text);

}  // namespace diffuse::accel
