// The merge-learning loop of BPE training, shared by the trainers of each tokenizer kind
// (CLIP's bpe_trainer, Llama's llama_bpe_trainer): they differ only in how text becomes words.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace diffuse::text {

// A pre-token as its initial symbols (byte characters, maybe with a suffix) -> how often it
// occurs in the corpus.
using BpeWordCounts = std::map<std::vector<std::string>, int64_t>;
using BpeMerge = std::pair<std::string, std::string>;

// Merges the most frequent adjacent pair of symbols (counted over `words`, weighted by their
// counts) until `num_merges` merges exist or no pair occurs twice. Ties break by the pair's
// text (the smaller wins), so the result is deterministic. Appends each merge's result to
// `tokens` unless it is already one of them (two pairs can spell the same token).
std::vector<BpeMerge> learn_bpe_merges(const BpeWordCounts& words, int num_merges,
                                       std::vector<std::string>& tokens);

}  // namespace diffuse::text
