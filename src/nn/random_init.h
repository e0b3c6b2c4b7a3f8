// Seeded random initialisation that keeps activations O(1) through deep networks: used to
// make demo models and benchmark models at real sizes without downloading weights.
#pragma once
#include <torch/nn/module.h>

#include <cstdint>

namespace diffuse::nn {

// Linear/Conv weights and mixture-of-experts gates ~ N(0, (g / sqrt(fan_in))^2) with g = 1,
// or 0.5 for residual-branch output projections (so residual sums do not blow up); biases
// ~ N(0, 0.05^2); norm weights ~ 1 + N(0, 0.2^2), norm biases ~ N(0, 0.1^2); token embeddings
// ~ N(0, 1), position embeddings ~ N(0, 0.5^2). Deterministic for a given seed and module
// structure: no parameter keeps values drawn from LibTorch's global generator.
void init_random_weights(torch::nn::Module& module, uint64_t seed);

// The same scales, with values copied from one pool of 8M normal draws at random offsets
// instead of drawn one by one: for benchmarks, which need realistic magnitudes at real model
// sizes (1.3B parameters) in a fraction of a second rather than independent values.
void init_pooled_random_weights(torch::nn::Module& module, uint64_t seed);

}  // namespace diffuse::nn
