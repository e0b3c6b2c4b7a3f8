#include "pipeline/token_tensors.h"

#include <torch/torch.h>

#include <algorithm>

namespace diffuse::pipeline {
namespace {

torch::Tensor rows_tensor(const std::vector<std::vector<int64_t>>& rows) {
  if (rows.empty()) return torch::empty({0, 0}, torch::kInt64);
  const int64_t n = static_cast<int64_t>(rows.size()), L = static_cast<int64_t>(rows[0].size());
  auto t = torch::empty({n, L}, torch::kInt64);
  for (int64_t i = 0; i < n; ++i)
    std::copy(rows[i].begin(), rows[i].end(), t[i].data_ptr<int64_t>());
  return t;
}

}  // namespace

torch::Tensor token_ids_tensor(const text::TokenBatch& batch) {
  return rows_tensor(batch.input_ids);
}

torch::Tensor token_mask_tensor(const text::TokenBatch& batch) {
  return rows_tensor(batch.attention_mask);
}

}  // namespace diffuse::pipeline
