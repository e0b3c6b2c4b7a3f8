// Ulysses sequence parallelism (DeepSpeed-Ulysses; the "U" of MindIE-SD's and xDiT's USP) for
// the DiTs' joint attention: each rank of a group holds a contiguous run of the image tokens and
// computes everything per token (projections, norms, feed-forward, MoE routing) for those alone.
// Around each attention an all-to-all trades the sequence split for a head split: a rank then
// holds every image token for its heads, attends exactly as one device would (the text tokens,
// which every rank holds whole, join with the same heads; the RoPE table and the padding mask
// apply to the whole sequence), and the reverse all-to-all brings its tokens back with every
// head. The final image tokens are gathered, so that the transformer's output, and the scheduler
// step after it, are the same on every rank.
//
// Uneven splits are allowed both ways: earlier ranks take one token (or one head) more. A head
// count the group size does not divide (HiDream's 20 heads on 8 ranks) thus works, at the pace
// of the ranks with the most heads; with more ranks than heads the last ranks hold none (they
// still compute their tokens' projections and feed-forward, and attend to nothing). A group
// needs at least one image token per rank.
#pragma once
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "parallel/rank_group.h"

namespace diffuse::parallel {

struct Span {
  int64_t first = 0;
  int64_t count = 0;
};

// Part `index` of `total` items cut into `parts` contiguous runs, earlier runs one longer.
Span even_span(int64_t total, int parts, int index);

// InvalidArgument unless there are at least 2 ranks and a head. (The tokens are checked per
// call, by UlyssesShard.)
void check_ulysses_group(int64_t heads, int world);

class UlyssesShard {
 public:
  // The group's split of one attention layout: `heads` heads, `image_tokens` image tokens
  // (padding included). InvalidArgument as check_ulysses_group, or for fewer tokens than
  // ranks.
  UlyssesShard(RankGroup& group, int64_t heads, int64_t image_tokens);

  Span rows() const { return rows_[static_cast<size_t>(group_.rank())]; }
  Span heads() const { return heads_[static_cast<size_t>(group_.rank())]; }
  int64_t image_tokens() const { return image_tokens_; }
  // This rank's image tokens of [B, image_tokens, ...] (a view).
  torch::Tensor local_rows(const torch::Tensor& whole) const;

  // Sequence split -> head split: each [B, rows().count, H, D] (q, k, v: one exchange for all)
  // becomes [B, image_tokens, heads().count, D].
  std::vector<torch::Tensor> to_heads(const std::vector<torch::Tensor>& local);
  // Head split -> sequence split: image [B, image_tokens, heads().count, D] becomes
  // [B, rows().count, H, D]; text [B, T, heads().count, D] (every rank's same tokens; may be
  // undefined) becomes [B, T, H, D], every head.
  std::pair<torch::Tensor, torch::Tensor> to_rows(const torch::Tensor& image,
                                                  const torch::Tensor& text);
  // One joint attention of this rank's image tokens with the text every rank holds whole:
  // image {q, k, v} [B, rows().count, H, D] and text {q, k, v} [B, T, H, D] -> (image out
  // [B, rows().count, H*D], text out [B, T, H*D]), through to_heads and to_rows. `attend(q, k,
  // v)` is the model's attention ([B, N, h, D] -> [B, N, h*D]) over the whole joint sequence in
  // its order: [image | text] (HiDream), or [text | image] with `text_first` (FLUX). A rank
  // without heads attends to nothing.
  using Attend = std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& v)>;
  std::pair<torch::Tensor, torch::Tensor> attend_joint(const std::array<torch::Tensor, 3>& image,
                                                       const std::array<torch::Tensor, 3>& text,
                                                       bool text_first, const Attend& attend);
  // [B, rows().count, ...] from every rank -> [B, image_tokens, ...].
  torch::Tensor gather_rows(const torch::Tensor& local);

  RankGroup& group() const { return group_; }

 private:
  RankGroup& group_;
  int64_t heads_total_, image_tokens_;
  std::vector<Span> rows_, heads_;
};

}  // namespace diffuse::parallel
