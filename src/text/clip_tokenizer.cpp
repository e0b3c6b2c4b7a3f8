#include "text/clip_tokenizer.h"

#include <climits>

#include "diffuse/errors.h"
#include "text/clip_pretokenizer.h"
#include "text/unicode.h"

namespace diffuse::text {
namespace {

// CLIPTokenizer seeds its BPE cache with these two words, so a regex match of either (which can
// only come from a differently-cased spelling, since the exact ones are split off as special
// tokens first) stays one token instead of going through BPE.
bool is_cached_special_word(const std::string& word) {
  return word == "<|startoftext|>" || word == "<|endoftext|>";
}

}  // namespace

int64_t ClipTokenizer::token_to_id(const std::string& token) const {
  if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  if (auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return unk_id_;
}

void ClipTokenizer::bpe_word(const std::string& word, std::vector<std::string>& out) const {
  std::string encoded;
  for (unsigned char b : word) encoded += byte_chars_[b];
  if (is_cached_special_word(encoded)) {
    out.push_back(encoded);
    return;
  }
  std::vector<std::string> symbols;
  symbols.reserve(word.size());
  for (unsigned char b : word) symbols.push_back(byte_chars_[b]);
  if (symbols.empty()) return;
  symbols.back() += "</w>";

  std::string key;
  auto rank_of = [&](const std::string& a, const std::string& b) {
    key.assign(a).append(" ").append(b);
    auto it = merge_ranks_.find(key);
    return it == merge_ranks_.end() ? INT_MAX : it->second;
  };
  std::vector<std::string> merged;
  while (symbols.size() > 1) {
    // The pair with the lowest rank is merged everywhere it occurs, left to right.
    int best = INT_MAX;
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      int r = rank_of(symbols[i], symbols[i + 1]);
      if (r < best) best = r, best_i = i;
    }
    if (best == INT_MAX) break;
    const std::string first = symbols[best_i];
    const std::string second = symbols[best_i + 1];
    merged.clear();
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == first && symbols[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(std::move(symbols[i]));
        ++i;
      }
    }
    symbols.swap(merged);
  }
  for (auto& s : symbols) out.push_back(std::move(s));
}

void ClipTokenizer::tokenize_segment(const std::u32string& segment,
                                     std::vector<std::string>& out) const {
  for (const auto& word : clip_split_words(clip_basic_clean(segment)))
    bpe_word(utf8_encode(word), out);
}

std::vector<std::string> ClipTokenizer::tokenize(const std::string& text) const {
  const std::u32string chars = utf8_decode(text);

  const auto pieces = split_added_tokens(chars, added_, added_u32_);
  std::vector<std::string> tokens;
  for (const auto& piece : pieces) {
    if (piece.text.empty()) continue;
    if (piece.token >= 0)
      tokens.push_back(added_[static_cast<size_t>(piece.token)].content);
    else
      tokenize_segment(piece.text, tokens);
  }
  return tokens;
}

std::vector<int64_t> ClipTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids{bos_id_};
  for (const auto& tok : tokenize(text)) ids.push_back(token_to_id(tok));
  ids.push_back(eos_id_);
  return ids;
}

ClipTokenizer::Batch ClipTokenizer::encode_padded(const std::vector<std::string>& texts,
                                                  int64_t max_length) const {
  if (max_length < 0) max_length = model_max_length_;
  if (max_length < 2)
    throw InvalidArgument("encode_padded: max_length " + std::to_string(max_length) +
                          " leaves no room for the BOS and EOS tokens (need >= 2)");
  const auto n = static_cast<size_t>(max_length);
  Batch batch;
  for (const auto& text : texts) {
    std::vector<int64_t> ids = encode(text);
    const bool truncated = ids.size() > n;
    if (truncated) {
      ids.resize(n);
      ids.back() = eos_id_;  // HF truncates the content, then appends EOS
    }
    batch.push_right_padded(std::move(ids), n, pad_id_, truncated);
  }
  return batch;
}

}  // namespace diffuse::text
