// Byte-level BPE from a Hugging Face tokenizer.json, as the Llama-3/3.1 folders ship it
// (PreTrainedTokenizerFast): added/special tokens matched literally first, the Split
// pre-tokenizer's regex (compiled by PCRE2 in UTF + UCP mode: \p{L}, \p{N}, \s as Unicode
// White_Space incl. U+0085, case-insensitive groups with Unicode case folding), GPT-2 byte
// characters, merges by rank with ignore_merges (a pre-token that is a vocabulary entry is one
// token), the TemplateProcessing post-processor's BOS, right padding and truncation. An NFC
// normalizer (Qwen2's tokenizer.json) is applied before anything else.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/added_tokens.h"
#include "text/token_batch.h"

namespace diffuse::text {

class PretokenizerRegex;

class LlamaTokenizer {
 public:
  // tokenizer.json (required), tokenizer_config.json / special_tokens_map.json (optional: eos,
  // pad, model_max_length). IoError if tokenizer.json is missing; FormatError / ConfigError
  // naming the file and the field for anything unsupported or inconsistent (a model type
  // other than BPE, a normalizer, merges that reference tokens missing from the vocabulary, a
  // regex PCRE2 rejects, ...).
  static LlamaTokenizer from_folder(const std::string& dir);
  ~LlamaTokenizer();
  LlamaTokenizer(LlamaTokenizer&&) noexcept;
  LlamaTokenizer& operator=(LlamaTokenizer&&) noexcept;

  // tokenizer(text).input_ids: the post-processor's special tokens (Llama-3: BOS) around the
  // BPE ids. InvalidArgument for invalid UTF-8.
  std::vector<int64_t> encode(const std::string& text) const;
  // The ids without special tokens added (tokenizer(text, add_special_tokens=False)).
  std::vector<int64_t> encode_ordinary(const std::string& text) const;
  // padding="max_length", truncation=True: the text's ids cut to leave room for the special
  // tokens (BOS + the first max_length-1 ids), right-padded with pad_id.
  TokenBatch encode_padded(const std::vector<std::string>& texts, int64_t max_length = -1) const;

  int64_t bos_id() const { return prefix_.empty() ? -1 : prefix_.front(); }
  int64_t eos_id() const { return eos_id_; }
  // The configured pad_token, else eos (what the HiDream pipelines set: pad_token = eos_token).
  int64_t pad_id() const { return pad_id_; }
  int64_t model_max_length() const { return model_max_length_; }
  size_t vocab_size() const { return vocab_.size(); }

 private:
  LlamaTokenizer();
  void bpe(std::string_view piece, std::vector<int64_t>& out) const;
  // eos / pad / model_max_length from the folder's tokenizer_config.json and
  // special_tokens_map.json (the latter wins); ConfigError when a token is not in the
  // vocabulary (`vocab_source` names where it was read).
  void read_special_tokens(const std::string& dir, const std::string& vocab_source);

  std::unordered_map<std::string, int64_t> vocab_;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int64_t>> merges_;
  std::array<int64_t, 256> byte_ids_{};
  std::array<std::string, 256> byte_chars_;
  bool ignore_merges_ = false;
  std::unique_ptr<PretokenizerRegex> regex_;
  std::vector<AddedToken> added_;
  std::vector<std::u32string> added_u32_;
  std::vector<int64_t> prefix_, suffix_;  // post-processor specials around the sequence
  int64_t eos_id_ = -1, pad_id_ = -1;
  int64_t model_max_length_ = 131072;
  bool nfc_ = false;  // the text is NFC-normalised first (Qwen2's tokenizers)

  friend LlamaTokenizer load_qwen2_tokenizer(const std::string& dir);
};

// Qwen2Tokenizer (text/qwen2_tokenizer.cpp): the same byte-level BPE from vocab.json +
// merges.txt.
LlamaTokenizer load_qwen2_tokenizer(const std::string& dir);

}  // namespace diffuse::text
