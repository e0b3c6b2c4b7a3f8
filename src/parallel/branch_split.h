// How the guidance branches of a CFG batch are spread over the ranks of a RankGroup, for any
// number of branches: the same code serves Stable Diffusion's two (negative, positive) and
// HiDream-E1's three (unconditional, image-conditioned, fully conditioned).
//
// A CFG batch is `branches` blocks of equal size stacked along dim 0, in the pipeline's order.
// Rank r takes a contiguous run of blocks (earlier ranks take one more when the split is
// uneven), runs the network on those rows only, and gather() rebuilds the whole batched
// prediction on every rank, so the guidance formula and the scheduler step that follow are
// the single-process code, replicated.
#pragma once
#include <torch/types.h>

#include "parallel/rank_group.h"

namespace diffuse::parallel {

struct BranchRange {
  int first = 0;  // index of the first branch this rank computes
  int count = 0;  // how many
};

// InvalidArgument unless 1 < world <= branches (a rank without a branch would idle, and one
// rank is not parallel).
void check_branch_split(int branches, int world);
BranchRange branches_of_rank(int branches, int world, int rank);

class BranchShard {
 public:
  BranchShard(RankGroup& group, int branches);
  const BranchRange& range() const { return range_; }
  // This rank's rows of a [branches * n, ...] tensor.
  torch::Tensor local(const torch::Tensor& batched) const;
  // The whole [branches * n, ...] tensor from every rank's local() rows, in branch order.
  torch::Tensor gather(const torch::Tensor& local_rows);

 private:
  RankGroup& group_;
  int branches_;
  BranchRange range_;
  int most_;  // the largest count of any rank: all_gather needs equal shapes, so pad to it
};

}  // namespace diffuse::parallel
