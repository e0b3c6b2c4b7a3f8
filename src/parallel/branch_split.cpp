#include "parallel/branch_split.h"

#include <torch/torch.h>

#include <cstring>
#include <sstream>

#include "diffuse/errors.h"

namespace diffuse::parallel {

void check_branch_split(int branches, int world) {
  if (world < 2)
    throw InvalidArgument("CFG-parallel needs at least 2 devices, got " + std::to_string(world));
  if (world > branches)
    throw InvalidArgument("CFG-parallel: " + std::to_string(world) + " devices for " +
                          std::to_string(branches) +
                          " guidance branches (expected at most one device per branch)");
}

BranchRange branches_of_rank(int branches, int world, int rank) {
  check_branch_split(branches, world);
  if (rank < 0 || rank >= world)
    throw InvalidArgument("CFG-parallel: rank " + std::to_string(rank) + " outside 0.." +
                          std::to_string(world - 1));
  const int base = branches / world, extra = branches % world;
  BranchRange r;
  r.count = base + (rank < extra ? 1 : 0);
  r.first = rank * base + std::min(rank, extra);
  return r;
}

BranchShard::BranchShard(RankGroup& group, int branches)
    : group_(group),
      branches_(branches),
      range_(branches_of_rank(branches, group.size(), group.rank())),
      most_(branches_of_rank(branches, group.size(), 0).count) {}

torch::Tensor BranchShard::local(const torch::Tensor& batched) const {
  if (batched.size(0) % branches_ != 0)
    throw InvalidArgument("CFG-parallel: a batch of " + std::to_string(batched.size(0)) +
                          " rows does not split into " + std::to_string(branches_) +
                          " guidance branches");
  const int64_t n = batched.size(0) / branches_;
  return batched.narrow(0, range_.first * n, range_.count * n);
}

torch::Tensor BranchShard::gather(const torch::Tensor& local_rows) {
  const int64_t n = local_rows.size(0) / range_.count;
  auto mine = local_rows.contiguous();
  if (range_.count < most_) {
    auto shape = mine.sizes().vec();
    shape[0] = (most_ - range_.count) * n;
    mine = torch::cat({mine, torch::zeros(shape, mine.options())});
  }
  auto parts = group_.all_gather(mine);
  std::vector<torch::Tensor> rows;
  for (int r = 0; r < group_.size(); ++r)
    rows.push_back(parts[static_cast<size_t>(r)].narrow(
        0, 0, branches_of_rank(branches_, group_.size(), r).count * n));
  return torch::cat(rows);
}

}  // namespace diffuse::parallel
