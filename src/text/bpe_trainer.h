// Learns a CLIP-style byte-level BPE vocabulary from text, so that models made by this
// project (the demo model) ship a tokenizer of their own instead of a copied vocabulary.
#pragma once
#include <string>
#include <vector>

namespace diffuse::text {

struct BpeVocabulary {
  std::vector<std::string> tokens;  // id order: 256 bytes, 256 bytes + "</w>", merges, specials
  std::vector<std::pair<std::string, std::string>> merges;
};

// Words are split exactly as ClipTokenizer splits them; the most frequent adjacent pair is
// merged until `num_merges` merges exist or no pair occurs twice. Ties break by the pair's
// text, so the result is deterministic. Ends with <|startoftext|> and <|endoftext|>.
BpeVocabulary train_clip_bpe(const std::vector<std::string>& corpus, int num_merges);

// Writes vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json into `dir`
// (created if needed) in the layout ClipTokenizer::from_folder and transformers read.
void save_clip_tokenizer(const BpeVocabulary& vocab, const std::string& dir,
                         int model_max_length = 77);

}  // namespace diffuse::text
