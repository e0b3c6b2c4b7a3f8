// Learns a T5 tokenizer (a SentencePiece model, spiece.model) from text, so that models
// made by this project (the HiDream demo model) ship a tokenizer of their own instead of a
// copied vocabulary. Training runs in libsentencepiece through the shim (sentencepiece_model.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::text {

// Trains a SentencePiece BPE model with T5's id layout (<pad> 0, </s> 1, <unk> 2, no BOS) and full
// character coverage on the sentences of `corpus` (a sentence with newlines counts as several),
// deterministically: all sentences, unshuffled, one thread. `vocab_size` is a soft limit
// (a small corpus yields fewer pieces) but must cover the corpus's characters plus the three
// specials. Writes into `dir` (created if needed) spiece.model, tokenizer_config.json and
// special_tokens_map.json in the layout T5Tokenizer::from_folder and transformers' T5Tokenizer
// read: legacy mode, no extra ids. Equal inputs give equal files. InvalidArgument for a corpus
// without visible text, invalid UTF-8, vocab_size < 4, model_max_length < 1, or when
// SentencePiece refuses to train (its message); IoError if the files cannot be written.
void train_t5_tokenizer(const std::vector<std::string>& corpus, int vocab_size,
                        const std::string& dir, int64_t model_max_length);

}  // namespace diffuse::text
