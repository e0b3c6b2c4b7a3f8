// T5's tokenizer as transformers' slow T5Tokenizer (legacy mode, the default of the hub's T5
// and HiDream folders) computes it: SentencePiece (libsentencepiece, spiece.model) for the
// text (run isolated, see sentencepiece_model.h), special tokens (</s>, <pad>, <unk>, <extra_id_N>)
// split off literally first, a trailing </s>, right padding with <pad>.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/added_tokens.h"
#include "text/sentencepiece_model.h"
#include "text/token_batch.h"

namespace diffuse::text {

class T5Tokenizer {
 public:
  // Loads spiece.model (required) and tokenizer_config.json / special_tokens_map.json
  // (optional; the map file's special tokens win). IoError if spiece.model is missing,
  // FormatError if it is not a SentencePiece model, ConfigError naming file and key for a
  // bad config value (including legacy=false, whose prefix rules are not implemented).
  static T5Tokenizer from_folder(const std::string& dir);

  // tokenizer(text).input_ids: the pieces' ids followed by </s> (not added twice when the text
  // already ends with a literal "</s>", as T5Tokenizer does). InvalidArgument for invalid UTF-8.
  std::vector<int64_t> encode(const std::string& text) const;
  // padding="max_length", truncation=True: the first max_length-1 ids, then </s>; right-padded
  // with pad_id. max_length < 0: model_max_length.
  TokenBatch encode_padded(const std::vector<std::string>& texts, int64_t max_length = -1) const;

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  int64_t model_max_length() const { return model_max_length_; }
  // SentencePiece pieces plus the extra ids (T5Tokenizer.vocab_size).
  int64_t vocab_size() const { return vocab_size_; }
  int64_t token_to_id(const std::string& token) const;

 private:
  T5Tokenizer() = default;

  std::shared_ptr<SentencePieceModel> sp_;
  std::vector<AddedToken> added_;
  std::vector<std::u32string> added_u32_;
  int64_t eos_id_ = 1, pad_id_ = 0, unk_id_ = 2;
  int64_t vocab_size_ = 0;
  int64_t model_max_length_ = 512;
};

}  // namespace diffuse::text
