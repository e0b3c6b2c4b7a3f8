#include "text/bpe_trainer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "text/bpe_merges.h"
#include "text/clip_pretokenizer.h"
#include "text/clip_tokenizer.h"
#include "text/tokenizer_files.h"
#include "text/unicode.h"

namespace diffuse::text {

BpeVocabulary train_clip_bpe(const std::vector<std::string>& corpus, int num_merges) {
  const auto bytes = clip_byte_characters();
  BpeWordCounts words;
  for (const auto& text : corpus) {
    for (const auto& w : clip_split_words(clip_basic_clean(utf8_decode(text)))) {
      std::string utf8 = utf8_encode(w);
      std::vector<std::string> symbols;
      for (unsigned char b : utf8) symbols.push_back(bytes[b]);
      if (symbols.empty()) continue;
      symbols.back() += "</w>";
      words[symbols]++;
    }
  }
  BpeVocabulary v;
  for (const auto& b : bytes) v.tokens.push_back(b);
  for (const auto& b : bytes) v.tokens.push_back(b + "</w>");
  v.merges = learn_bpe_merges(words, num_merges, v.tokens);
  v.tokens.push_back("<|startoftext|>");
  v.tokens.push_back("<|endoftext|>");
  return v;
}

void save_clip_tokenizer(const BpeVocabulary& vocab, const std::string& dir, int model_max_length) {
  namespace fs = std::filesystem;
  create_tokenizer_folder(dir);
  nlohmann::ordered_json v = nlohmann::ordered_json::object();
  for (size_t i = 0; i < vocab.tokens.size(); ++i) v[vocab.tokens[i]] = i;
  io::write_file_atomically((fs::path(dir) / "vocab.json").string(),
                            [&](std::ostream& out) { out << v.dump(); });
  io::write_file_atomically((fs::path(dir) / "merges.txt").string(), [&](std::ostream& out) {
    out << "#version: 0.2\n";
    for (const auto& [a, b] : vocab.merges) out << a << " " << b << "\n";
  });
  nlohmann::ordered_json special = {{"bos_token", "<|startoftext|>"},
                                    {"eos_token", "<|endoftext|>"},
                                    {"pad_token", "<|endoftext|>"},
                                    {"unk_token", "<|endoftext|>"}};
  nlohmann::ordered_json config = special;
  config["model_max_length"] = model_max_length;
  config["do_lower_case"] = true;
  config["tokenizer_class"] = "CLIPTokenizer";
  write_tokenizer_json(dir, "special_tokens_map.json", special);
  write_tokenizer_json(dir, "tokenizer_config.json", config);
}

}  // namespace diffuse::text
