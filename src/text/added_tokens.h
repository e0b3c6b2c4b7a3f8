// transformers' "added tokens": strings matched literally in the raw text before the model's
// own tokenization (special tokens such as </s> or <|eot_id|>, extra ids). Shared by every
// tokenizer, so they all split text the same way transformers' Trie.split does.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace diffuse::text {

struct AddedToken {
  std::string content;  // UTF-8
  int64_t id = 0;
  bool lstrip = false;  // eats whitespace on its left
  bool rstrip = false;  // eats whitespace on its right
  bool single_word = false;
};

// A special token value as tokenizer configs write it: a string or an AddedToken object
// {"content": ..., "lstrip": ..., ...}. Returns false for null; ConfigError naming `where`
// for anything else.
bool parse_added_token_json(const nlohmann::json& v, const std::string& where, AddedToken& out);

// One piece of a split text: an added token (token >= 0, an index into the token list) or
// text between tokens (token == -1). Pieces emptied by stripping stay in the list, empty.
struct TextPiece {
  std::u32string text;
  int token = -1;
};

// Splits `text` on `tokens` (at each position the longest token starting there wins), then
// applies lstrip / rstrip (Python str.strip whitespace) and single_word in transformers'
// order. `tokens_u32[i]` is tokens[i].content decoded (callers keep it to avoid re-decoding).
std::vector<TextPiece> split_added_tokens(const std::u32string& text,
                                          const std::vector<AddedToken>& tokens,
                                          const std::vector<std::u32string>& tokens_u32);

}  // namespace diffuse::text
