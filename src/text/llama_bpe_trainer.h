// Learns a Llama-3 style byte-level BPE tokenizer (tokenizer.json) from text, so that models
// made by this project (the HiDream demo model) ship a tokenizer of their own instead of a
// copied vocabulary.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::text {

// Splits each sentence with Llama-3's pre-tokenizer regex, maps the pieces' bytes to GPT-2 byte
// characters and learns up to `num_merges` merges (learn_bpe_merges: most frequent pair first,
// ties by text, stop when no pair occurs twice). Writes into `dir` (created if needed)
// tokenizer.json, tokenizer_config.json and special_tokens_map.json in the layout
// LlamaTokenizer::from_folder and transformers' PreTrainedTokenizerFast read. Ids: the 256 byte
// characters in byte order, the merges' results in merge order, then <|begin_of_text|> (BOS,
// added by the post-processor) and <|end_of_text|> (EOS; also the padding, as the HiDream
// pipelines pad with EOS). Equal inputs give equal files. InvalidArgument for an empty corpus
// (no text at all), invalid UTF-8, num_merges < 0 or model_max_length < 1; IoError if the
// files cannot be written.
void train_llama_tokenizer(const std::vector<std::string>& corpus, int num_merges,
                           const std::string& dir, int64_t model_max_length);

}  // namespace diffuse::text
