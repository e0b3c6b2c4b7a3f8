#include "parallel/replicated.h"

#include <torch/torch.h>

#include <cstring>
#include <sstream>

#include "diffuse/errors.h"

namespace diffuse::parallel {

void check_replicated(RankGroup& group, const torch::Tensor& t, const std::string& what) {
  const uint64_t h = tensor_hash(t);
  int64_t as_signed;
  std::memcpy(&as_signed, &h, sizeof h);
  auto mine =
      torch::full({1}, as_signed, torch::TensorOptions().dtype(torch::kInt64)).to(t.device());
  auto all = group.all_gather(mine);
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
    throw Error("the ranks' " + what + " differ (" + hashes.str() +
                "); every rank must compute the same scheduler step bit for bit (" +
                group.describe() + ")");
}

std::vector<double> sum_over_ranks(RankGroup& group, const std::vector<double>& mine) {
  std::vector<float> values(mine.begin(), mine.end());
  auto t = torch::tensor(values, torch::kFloat32).to(group.device());
  auto all = group.all_gather(t, "decision inputs");
  std::vector<double> sums(mine.size(), 0.0);
  for (const auto& part : all) {
    auto cpu = part.to(torch::kCPU, torch::kFloat64);
    for (size_t i = 0; i < sums.size(); ++i) sums[i] += cpu[static_cast<int64_t>(i)].item<double>();
  }
  return sums;
}

std::function<std::vector<double>(const std::vector<double>&)> sum_over_ranks(RankGroup& group) {
  return [&group](const std::vector<double>& mine) { return sum_over_ranks(group, mine); };
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
