// CLIP byte-level BPE tokenizer, reproducing transformers' slow CLIPTokenizer (as used by
// StableDiffusionPipeline) id for id: added/special tokens are split off first, the rest is
// cleaned (clip_pretokenizer.h), split into words, mapped to byte characters and merged by
// rank; the last symbol of each word carries "</w>".
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/added_tokens.h"
#include "text/token_batch.h"

namespace diffuse::text {

// GPT-2/CLIP bytes_to_unicode: the printable UTF-8 stand-in of each byte value.
std::array<std::string, 256> clip_byte_characters();

class ClipTokenizer {
 public:
  // A token that is matched literally in the raw text before any clean-up (transformers'
  // AddedToken): the special tokens, plus any added_tokens_decoder / added_tokens.json entries.
  using AddedToken = text::AddedToken;

  using Batch = TokenBatch;

  // Loads a diffusers/transformers tokenizer folder: vocab.json and merges.txt (required),
  // tokenizer_config.json and special_tokens_map.json (optional; the latter's special tokens
  // win, as in transformers), added_tokens.json (optional). IoError for a missing required
  // file, FormatError/ConfigError naming the file for malformed content.
  static ClipTokenizer from_folder(const std::string& dir);

  // Token ids of `text` with BOS and EOS, no padding, no truncation (tokenizer(text).input_ids).
  // InvalidArgument if `text` is not valid UTF-8.
  std::vector<int64_t> encode(const std::string& text) const;
  // The BPE tokens of `text` without BOS/EOS (tokenizer.tokenize(text)), UTF-8 byte-level
  // strings as in vocab.json.
  std::vector<std::string> tokenize(const std::string& text) const;

  // What StableDiffusionPipeline.encode_prompt computes: padding="max_length",
  // truncation=True. Sequences longer than `max_length` (default: model_max_length) keep BOS,
  // the first max_length-2 tokens and EOS; shorter ones are right-padded with pad_id.
  Batch encode_padded(const std::vector<std::string>& texts, int64_t max_length = -1) const;

  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  int64_t model_max_length() const { return model_max_length_; }
  size_t vocab_size() const { return vocab_.size(); }
  // The token with the largest id (vocabulary and added tokens), to check it against the text
  // encoder's embedding table.
  std::pair<std::string, int64_t> largest_id_token() const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // Id of one token string (added tokens first, then the vocabulary, else unk_id).
  int64_t token_to_id(const std::string& token) const;

 private:
  ClipTokenizer() = default;
  // Appends the BPE tokens of one word (a regex match, UTF-8) to `out`.
  void bpe_word(const std::string& word, std::vector<std::string>& out) const;
  // Appends the tokens of a text segment that holds no added token.
  void tokenize_segment(const std::u32string& segment, std::vector<std::string>& out) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<std::string, int> merge_ranks_;  // "left right" -> rank
  std::vector<AddedToken> added_;
  std::vector<std::u32string> added_u32_;  // added_[i].content decoded, for matching
  std::unordered_map<std::string, int64_t> added_ids_;
  std::array<std::string, 256> byte_chars_;  // byte -> its printable stand-in (UTF-8)
  int64_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0, unk_id_ = 0;
  int64_t model_max_length_ = 77;

  friend class ClipTokenizerLoader;
};

}  // namespace diffuse::text
