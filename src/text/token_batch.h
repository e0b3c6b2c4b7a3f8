// What every tokenizer hands a text encoder: a padded batch of ids with its attention mask.
#pragma once
#include <cstdint>
#include <vector>

namespace diffuse::text {

struct TokenBatch {
  std::vector<std::vector<int64_t>> input_ids;       // [n][max_length]
  std::vector<std::vector<int64_t>> attention_mask;  // 1 for tokens, 0 for padding
  std::vector<bool> truncated;  // prompt i lost tokens to truncation (callers may warn)

  // Appends one already-truncated sequence, right-padded with `pad_id` to `max_length`.
  void push_right_padded(std::vector<int64_t> ids, size_t max_length, int64_t pad_id,
                         bool was_truncated) {
    std::vector<int64_t> mask(ids.size(), 1);
    ids.resize(max_length, pad_id);
    mask.resize(max_length, 0);
    input_ids.push_back(std::move(ids));
    attention_mask.push_back(std::move(mask));
    truncated.push_back(was_truncated);
  }
};

}  // namespace diffuse::text
