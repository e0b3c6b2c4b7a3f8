// Rotary position embedding over several position axes, as Flux and HiDream use it
// (diffusers HiDreamImageEmbedND + apply_rope): each axis owns a slice of the rotated head
// dimensions, and ROTATION PAIRS ARE ADJACENT elements (2i, 2i+1), unlike the half-split
// pairs of Llama/GPT-NeoX rotary embeddings.
#pragma once
#include <torch/types.h>

#include <vector>

namespace diffuse::nn {

// cos and sin of the rotation angles: [S, R] float32 each, R = sum(axes_dims) / 2.
struct RopeTable {
  torch::Tensor cos, sin;
  int64_t tokens() const { return cos.size(0); }
  int64_t rotated_dims() const { return 2 * cos.size(1); }
};

// ids [S, n_axes] (positions, any numeric dtype) -> the table. For axis a with d = axes_dims[a]
// (even): angle = id * theta^(-2k/d), k < d/2, computed in float64 and rounded to float32
// (diffusers' rope() computes in float64 and returns .float()). InvalidArgument on odd dims
// or a mismatch between ids and axes.
RopeTable rope_table(const torch::Tensor& ids, const std::vector<int64_t>& axes_dims, double theta,
                     const torch::Device& device);

// x [B, N, H, D] with N >= table.tokens() and D >= table.rotated_dims(): rotates the first
// table.tokens() tokens' first rotated_dims() channels in float32 (pairs (2i, 2i+1)):
//   (x0, x1) -> (cos x0 - sin x1, sin x0 + cos x1)
// and leaves the rest unchanged (tokens at position 0 on every axis, e.g. HiDream's text,
// would be rotated by the identity anyway). Returns a new tensor in x's dtype.
torch::Tensor apply_rope(const torch::Tensor& x, const RopeTable& table);

// diffusers' layout of the same table for `total_tokens` (>= table.tokens(); the rest are
// identity rows): [1, total_tokens, 1, R, 2, 2] holding [[cos, -sin], [sin, cos]] (for
// golden comparisons of the pe_embedder output).
torch::Tensor rope_table_as_matrices(const RopeTable& table, int64_t total_tokens);

}  // namespace diffuse::nn
