#include "accel/token_merging.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "diffuse/errors.h"

namespace diffuse::accel {
namespace {

// [B, K] indices -> [B, K, C] for gather/scatter along the token dimension.
torch::Tensor along_tokens(const torch::Tensor& index, int64_t channels) {
  return index.unsqueeze(-1).expand({index.size(0), index.size(1), channels});
}

std::string transformer_name(const char* part, size_t block, int64_t index) {
  return std::string(part) + "." + std::to_string(block) + ".attentions." + std::to_string(index);
}

}  // namespace

TokenMatch match_tokens(const torch::Tensor& metric, int64_t height, int64_t width, double ratio,
                        at::Generator& gen) {
  const int64_t N = metric.size(1);
  if (N != height * width)
    throw InvalidArgument("token merging: " + std::to_string(N) + " tokens are not a " +
                          std::to_string(height) + "x" + std::to_string(width) + " grid");
  TokenMatch m;
  m.tokens = N;
  const int64_t cells_y = height / 2, cells_x = width / 2;
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  // One destination per full 2x2 cell at a random offset; drawn on the CPU so that a seed
  // gives the same matching on every device.
  auto offset = torch::randint(4, {cells_y * cells_x}, gen, i64);
  auto cy = torch::arange(cells_y, i64).repeat_interleave(cells_x);
  auto cx = torch::arange(cells_x, i64).repeat({cells_y});
  auto dst = (cy * 2 + offset.div(2, "floor")) * width + cx * 2 + offset.remainder(2);
  auto is_dst = torch::zeros({N}, torch::TensorOptions().dtype(torch::kBool));
  is_dst.index_fill_(0, dst, true);
  const auto device = metric.device();
  m.dst_pos = torch::nonzero(is_dst).flatten().to(device);
  m.src_pos = torch::nonzero(is_dst.logical_not()).flatten().to(device);
  const int64_t sources = m.src_pos.size(0);
  const int64_t r = std::min(sources, static_cast<int64_t>(std::floor(N * ratio)));
  if (r <= 0 || m.dst_pos.size(0) == 0) return m;

  auto a = metric.index_select(1, m.src_pos);
  auto b = metric.index_select(1, m.dst_pos);
  a = a / a.norm(2, -1, /*keepdim=*/true);
  b = b / b.norm(2, -1, /*keepdim=*/true);
  auto scores = torch::matmul(a, b.transpose(1, 2));  // [B, S, D] cosine similarities
  auto [best, best_dst] = scores.max(-1);
  auto order = std::get<1>(best.sort(-1, /*descending=*/true));  // most similar first
  m.merged = order.narrow(1, 0, r);
  m.unmerged = order.narrow(1, r, sources - r);
  m.merged_into = best_dst.gather(1, m.merged);
  return m;
}

torch::Tensor merge_tokens(const TokenMatch& m, const torch::Tensor& x) {
  if (m.merged_count() == 0) return x;
  const int64_t C = x.size(2);
  auto src = x.index_select(1, m.src_pos);
  auto dst = x.index_select(1, m.dst_pos);
  auto kept = src.gather(1, along_tokens(m.unmerged, C));
  auto moving = src.gather(1, along_tokens(m.merged, C));
  // Mean of each destination and what joins it (scatter_add: scatter_reduce is "beta" in
  // libtorch 1.13 and warns).
  const auto into = along_tokens(m.merged_into, C);
  auto count =
      torch::ones({dst.size(0), dst.size(1), 1}, dst.options())
          .scatter_add(1, m.merged_into.unsqueeze(-1), torch::ones_like(moving.narrow(2, 0, 1)));
  dst = dst.scatter_add(1, into, moving) / count;
  return torch::cat({kept, dst}, 1);
}

torch::Tensor unmerge_tokens(const TokenMatch& m, const torch::Tensor& y) {
  if (m.merged_count() == 0) return y;
  const int64_t B = y.size(0), C = y.size(2);
  const int64_t kept_count = m.unmerged.size(1);
  auto kept = y.narrow(1, 0, kept_count);
  auto dst = y.narrow(1, kept_count, y.size(1) - kept_count);
  auto src = torch::empty({B, m.src_pos.size(0), C}, y.options());
  src.scatter_(1, along_tokens(m.unmerged, C), kept);
  src.scatter_(1, along_tokens(m.merged, C), dst.gather(1, along_tokens(m.merged_into, C)));
  auto out = torch::empty({B, m.tokens, C}, y.options());
  out.index_copy_(1, m.dst_pos, dst);
  out.index_copy_(1, m.src_pos, src);
  return out;
}

void validate_token_merging(const TokenMergingOptions& o) {
  if (!(o.ratio >= 0 && o.ratio < 1))
    throw InvalidArgument("token merging ratio (tome): got " + std::to_string(o.ratio) +
                          ", expected a fraction of tokens in [0, 1) (0 = off)");
}

std::set<std::string> token_merging_sites(const TokenMergingOptions& o,
                                          const models::UNet2DConditionConfig& unet) {
  // Every transformer of this UNet, and the default choice.
  std::set<std::string> all;
  std::vector<std::string> first_down, last_up;
  const size_t n = unet.down_block_types.size();
  for (size_t i = 0; i < n; ++i) {
    if (unet.down_block_types[i] != "CrossAttnDownBlock2D") continue;
    const bool first = first_down.empty();
    for (int64_t j = 0; j < unet.layers_per_block[i]; ++j) {
      all.insert(transformer_name("down_blocks", i, j));
      if (first && j < 2) first_down.push_back(transformer_name("down_blocks", i, j));
    }
  }
  if (!unet.mid_block_type.empty()) all.insert("mid_block.attentions.0");
  for (size_t i = 0; i < unet.up_block_types.size(); ++i) {
    if (unet.up_block_types[i] != "CrossAttnUpBlock2D") continue;
    const int64_t count = unet.layers_per_block[n - 1 - i] + 1;
    last_up.clear();
    for (int64_t j = 0; j < count; ++j) {
      all.insert(transformer_name("up_blocks", i, j));
      if (j >= count - 2) last_up.push_back(transformer_name("up_blocks", i, j));
    }
  }
  std::set<std::string> sites;
  if (o.layers.empty()) {
    sites.insert(first_down.begin(), first_down.end());
    sites.insert(last_up.begin(), last_up.end());
    return sites;
  }
  for (const auto& name : o.layers) {
    if (!all.count(name)) {
      std::string list;
      for (const auto& a : all) list += (list.empty() ? "" : ", ") + a;
      throw InvalidArgument("token merging layer '" + name +
                            "' is not a transformer of this UNet (" + unet.source +
                            "; expected one of: " + list + ")");
    }
    sites.insert(name);
  }
  return sites;
}

TokenMerging::TokenMerging(double ratio, std::set<std::string> sites, uint64_t seed)
    : ratio_(ratio), sites_(std::move(sites)), gen_(at::detail::createCPUGenerator(seed)) {}

std::optional<nn::TokenMergePlan> TokenMerging::plan(const std::string& site, int64_t /*block*/,
                                                     const torch::Tensor& x, int64_t height,
                                                     int64_t width) {
  if (ratio_ <= 0 || !sites_.count(site)) return std::nullopt;
  auto match = std::make_shared<TokenMatch>(match_tokens(x, height, width, ratio_, gen_));
  nn::TokenMergePlan p;
  p.merge = [match](const torch::Tensor& t) { return merge_tokens(*match, t); };
  p.unmerge = [match](const torch::Tensor& t) { return unmerge_tokens(*match, t); };
  return p;
}

}  // namespace diffuse::accel
