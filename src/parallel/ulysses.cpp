#include "parallel/ulysses.h"

#include <torch/torch.h>

#include <string>

#include "diffuse/errors.h"

namespace diffuse::parallel {
namespace {

std::string ulysses_shape(const torch::Tensor& t) {
  return c10::str(t.sizes());
}

// [B, S, H, D] -> the flat bytes of rows `rows` and heads `heads`, in that order.
torch::Tensor flat_block(const torch::Tensor& t, Span rows, Span heads) {
  return t.narrow(1, rows.first, rows.count).narrow(2, heads.first, heads.count).reshape({-1});
}

}  // namespace

Span even_span(int64_t total, int parts, int index) {
  const int64_t base = total / parts, extra = total % parts;
  Span s;
  s.first = index * base + std::min<int64_t>(index, extra);
  s.count = base + (index < extra ? 1 : 0);
  return s;
}

void check_ulysses_group(int64_t heads, int world) {
  if (world < 2)
    throw InvalidArgument("Ulysses sequence parallelism needs at least 2 ranks, got " +
                          std::to_string(world));
  if (heads < 1)
    throw InvalidArgument("Ulysses: a model without attention heads (" + std::to_string(heads) +
                          ")");
}

UlyssesShard::UlyssesShard(RankGroup& group, int64_t heads, int64_t image_tokens)
    : group_(group), heads_total_(heads), image_tokens_(image_tokens) {
  const int world = group.size();
  check_ulysses_group(heads, world);
  if (image_tokens < world)
    throw InvalidArgument("Ulysses: " + std::to_string(world) + " ranks for " +
                          std::to_string(image_tokens) +
                          " image tokens (each rank holds at least one)");
  for (int r = 0; r < group.size(); ++r) {
    rows_.push_back(even_span(image_tokens, group.size(), r));
    heads_.push_back(even_span(heads, group.size(), r));
  }
}

torch::Tensor UlyssesShard::local_rows(const torch::Tensor& whole) const {
  if (whole.dim() < 2 || whole.size(1) != image_tokens_)
    throw InvalidArgument("Ulysses: expected [B, " + std::to_string(image_tokens_) +
                          ", ...] image tokens, got " + ulysses_shape(whole));
  return whole.narrow(1, rows().first, rows().count);
}

std::vector<torch::Tensor> UlyssesShard::to_heads(const std::vector<torch::Tensor>& local) {
  const auto me = rows();
  for (const auto& t : local)
    if (t.dim() != 4 || t.size(1) != me.count || t.size(2) != heads_total_)
      throw InvalidArgument("Ulysses: expected [B, " + std::to_string(me.count) + ", " +
                            std::to_string(heads_total_) + ", D] before attention, got " +
                            ulysses_shape(t));
  const int world = group_.size();
  const int64_t B = local.at(0).size(0), D = local[0].size(3);
  const int64_t k = static_cast<int64_t>(local.size());
  std::vector<torch::Tensor> pieces;
  std::vector<int64_t> send_counts, recv_counts;
  for (int j = 0; j < world; ++j) {
    for (const auto& t : local) pieces.push_back(flat_block(t, {0, me.count}, heads_[j]));
    send_counts.push_back(k * B * me.count * heads_[j].count * D);
    recv_counts.push_back(k * B * rows_[j].count * heads().count * D);
  }
  auto send = torch::cat(pieces);
  auto got = group_.all_to_all(send, send_counts, recv_counts, "attention inputs (Ulysses)");
  // From rank i: k blocks [B, rows_i, my heads, D], one per input.
  std::vector<std::vector<torch::Tensor>> by_input(local.size());
  int64_t at = 0;
  for (int i = 0; i < world; ++i) {
    const int64_t n = B * rows_[i].count * heads().count * D;
    for (size_t q = 0; q < local.size(); ++q, at += n)
      by_input[q].push_back(got.narrow(0, at, n).view({B, rows_[i].count, heads().count, D}));
  }
  std::vector<torch::Tensor> out;
  for (auto& parts : by_input) out.push_back(torch::cat(parts, 1));
  return out;
}

std::pair<torch::Tensor, torch::Tensor> UlyssesShard::to_rows(const torch::Tensor& image,
                                                              const torch::Tensor& text) {
  const auto mine = heads();
  if (image.dim() != 4 || image.size(1) != image_tokens_ || image.size(2) != mine.count)
    throw InvalidArgument("Ulysses: expected [B, " + std::to_string(image_tokens_) + ", " +
                          std::to_string(mine.count) + ", D] after attention, got " +
                          ulysses_shape(image));
  const int world = group_.size();
  const int64_t B = image.size(0), D = image.size(3);
  const int64_t T = text.defined() ? text.size(1) : 0;
  const auto text_flat = T > 0 ? text.reshape({-1}) : torch::Tensor();
  std::vector<torch::Tensor> pieces;
  std::vector<int64_t> send_counts, recv_counts;
  for (int j = 0; j < world; ++j) {
    pieces.push_back(flat_block(image, rows_[j], {0, mine.count}));
    if (T > 0) pieces.push_back(text_flat);
    send_counts.push_back(B * (rows_[j].count + T) * mine.count * D);
    recv_counts.push_back(B * (rows().count + T) * heads_[j].count * D);
  }
  auto send = torch::cat(pieces);
  auto got = group_.all_to_all(send, send_counts, recv_counts, "attention outputs (Ulysses)");
  std::vector<torch::Tensor> image_parts, text_parts;
  int64_t at = 0;
  for (int i = 0; i < world; ++i) {
    const int64_t h = heads_[i].count;
    const int64_t ni = B * rows().count * h * D, nt = B * T * h * D;
    image_parts.push_back(got.narrow(0, at, ni).view({B, rows().count, h, D}));
    at += ni;
    if (T > 0) text_parts.push_back(got.narrow(0, at, nt).view({B, T, h, D}));
    at += nt;
  }
  return {torch::cat(image_parts, 2), T > 0 ? torch::cat(text_parts, 2) : torch::Tensor()};
}

std::pair<torch::Tensor, torch::Tensor> UlyssesShard::attend_joint(
    const std::array<torch::Tensor, 3>& image, const std::array<torch::Tensor, 3>& text,
    bool text_first, const Attend& attend) {
  const int64_t B = image[0].size(0), Ni = image[0].size(1), H = image[0].size(2);
  const int64_t D = image[0].size(3), Nt = text[0].size(1), S = image_tokens_;
  const auto mine = heads();
  auto all = to_heads({image[0], image[1], image[2]});
  const auto joint = [&](size_t i) {
    auto t = text[i].narrow(2, mine.first, mine.count);
    return text_first ? torch::cat({t, all[i]}, 1) : torch::cat({all[i], t}, 1);
  };
  auto o = mine.count == 0
               ? all[0].new_empty({B, S + Nt, 0, D})
               : attend(joint(0), joint(1), joint(2)).reshape({B, S + Nt, mine.count, D});
  const int64_t image_at = text_first ? Nt : 0, text_at = text_first ? 0 : S;
  auto [oi, ot] = to_rows(o.narrow(1, image_at, S), o.narrow(1, text_at, Nt));
  return {oi.reshape({B, Ni, H * D}),
          Nt > 0 ? ot.reshape({B, Nt, H * D}) : o.new_empty({B, 0, H * D})};
}

torch::Tensor UlyssesShard::gather_rows(const torch::Tensor& local) {
  const auto me = rows();
  if (local.dim() < 2 || local.size(1) != me.count)
    throw InvalidArgument("Ulysses: expected [B, " + std::to_string(me.count) +
                          ", ...] to gather, got " + ulysses_shape(local));
  // all_gather wants one shape: every rank pads to the longest run.
  const int64_t most = rows_[0].count;
  auto mine = local.contiguous();
  if (me.count < most) {
    auto shape = mine.sizes().vec();
    shape[1] = most - me.count;
    mine = torch::cat({mine, torch::zeros(shape, mine.options())}, 1);
  }
  auto parts = group_.all_gather(mine, "image tokens (Ulysses)");
  std::vector<torch::Tensor> rows;
  for (int r = 0; r < group_.size(); ++r)
    rows.push_back(parts[static_cast<size_t>(r)].narrow(1, 0, rows_[static_cast<size_t>(r)].count));
  return torch::cat(rows, 1);
}

}  // namespace diffuse::parallel
