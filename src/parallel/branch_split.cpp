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

BranchShard::BranchShard(CfgGroup& group, int branches)
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

void BranchShard::check_replicated(const torch::Tensor& t, const std::string& what) {
  const uint64_t h = tensor_hash(t);
  int64_t as_signed;
  std::memcpy(&as_signed, &h, sizeof h);
  auto mine =
      torch::full({1}, as_signed, torch::TensorOptions().dtype(torch::kInt64)).to(t.device());
  auto all = group_.all_gather(mine);
  const int64_t first = all[0].cpu().item<int64_t>();
  bool same = true;
  std::ostringstream hashes;
  for (size_t r = 0; r < all.size(); ++r) {
    const int64_t v = all[r].cpu().item<int64_t>();
    same = same && v == first;
    hashes << (r ? ", " : "") << "rank " << r << " " << std::hex << static_cast<uint64_t>(v)
           << std::dec;
  }
  if (!same)
    throw Error("CFG-parallel: the ranks' " + what + " differ (" + hashes.str() +
                "); every rank must compute the same scheduler step bit for bit (" +
                group_.describe() + ")");
}

uint64_t tensor_hash(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kCPU).contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const size_t bytes = static_cast<size_t>(c.numel()) * c.element_size();
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace diffuse::parallel
