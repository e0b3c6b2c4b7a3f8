// Any tokenizer folder behind one interface, recognised by its files the way the hub lays
// them out: spiece.model -> T5 (SentencePiece), vocab.json + merges.txt -> CLIP BPE (Qwen2's
// byte-level BPE when tokenizer_config.json names Qwen2Tokenizer), tokenizer.json -> byte-level
// BPE (Llama-3). Pipelines and `diffuse verify` use this when a
// folder may hold any of them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/token_batch.h"

namespace diffuse::text {

class LlamaTokenizer;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "clip", "t5", "llama", "qwen2".
  virtual std::string kind() const = 0;
  // tokenizer(text).input_ids: with the family's special tokens, no padding or truncation.
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // The pipelines' call: padding="max_length", truncation=True (max_length < 0: the folder's
  // model_max_length).
  virtual TokenBatch encode_padded(const std::vector<std::string>& texts,
                                   int64_t max_length = -1) const = 0;
  // -1 where the family has no such token.
  virtual int64_t bos_id() const = 0;
  virtual int64_t eos_id() const = 0;
  virtual int64_t pad_id() const = 0;
  virtual int64_t model_max_length() const = 0;
};

// Loads the tokenizer in `dir`. IoError if the folder is missing or has none of the files
// above (the message lists what was looked for); loader errors of the family otherwise.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);
// load_tokenizer through a small process-wide cache (the last few folders, keyed by the folder
// and the size and modification time of every file in it): pipelines built again on the same
// folder (verify's cases, a server's reloads, ranks that share a process) parse a Llama-3
// tokenizer.json (9 MB, 280k merges: a third of a tiny HiDream pipeline's run) once. A
// tokenizer never changes once loaded, so the copies are shared. Thread-safe.
std::shared_ptr<const Tokenizer> shared_tokenizer(const std::string& dir);
// load_qwen2_tokenizer through the same kind of cache (Qwen-Image's text stack needs the
// LlamaTokenizer itself: its templates are encoded without special tokens).
std::shared_ptr<const LlamaTokenizer> shared_qwen2_tokenizer(const std::string& dir);
// Whether tokenizer_config.json in `dir` names Qwen2Tokenizer(Fast).
bool is_qwen2_tokenizer_folder(const std::string& dir);

}  // namespace diffuse::text
