// State every rank of a group holds whole (the latents after a scheduler step) must be
// bit-identical everywhere: the ranks compute it with the same code from the same gathered
// inputs. These check that, instead of letting the ranks silently drift apart.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/rank_group.h"

namespace diffuse::parallel {

// FNV-1a over the bytes of `t` (moved to the CPU, contiguous): equal tensors, equal hashes.
uint64_t tensor_hash(const torch::Tensor& t);

// Compares a hash of `t` across the group; throws diffuse::Error naming `what` and every
// rank's hash on a mismatch.
void check_replicated(RankGroup& group, const torch::Tensor& t, const std::string& what);

// Adds a few numbers over the ranks (exchanged as float32 on the group's device, which every
// backend takes): every rank gets the same sums, in the same order of addition.
std::vector<double> sum_over_ranks(RankGroup& group, const std::vector<double>& mine);
// The same, bound to `group`, for code that takes a function.
std::function<std::vector<double>(const std::vector<double>&)> sum_over_ranks(RankGroup& group);

}  // namespace diffuse::parallel
