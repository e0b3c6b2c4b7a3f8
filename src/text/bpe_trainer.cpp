#include "text/bpe_trainer.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "diffuse/errors.h"
#include "io/atomic_file.h"
#include "text/clip_pretokenizer.h"
#include "text/clip_tokenizer.h"
#include "text/unicode.h"

namespace diffuse::text {

BpeVocabulary train_clip_bpe(const std::vector<std::string>& corpus, int num_merges) {
  const auto bytes = clip_byte_characters();
  // Word (as its symbol sequence) -> count.
  std::map<std::vector<std::string>, int64_t> words;
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
  std::set<std::string> known(v.tokens.begin(), v.tokens.end());
  std::vector<std::pair<std::vector<std::string>, int64_t>> work(words.begin(), words.end());
  for (int m = 0; m < num_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [syms, count] : work)
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += count;
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_count = 1;
    for (const auto& [pair, count] : pairs)
      if (count > best_count) best = &pair, best_count = count;
    if (!best) break;
    auto merged_pair = *best;
    std::string merged = merged_pair.first + merged_pair.second;
    v.merges.push_back(merged_pair);
    if (known.insert(merged).second) v.tokens.push_back(merged);
    for (auto& [syms, count] : work) {
      std::vector<std::string> out;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == merged_pair.first && syms[i + 1] == merged_pair.second) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(syms[i]);
        }
      }
      syms.swap(out);
    }
  }
  v.tokens.push_back("<|startoftext|>");
  v.tokens.push_back("<|endoftext|>");
  return v;
}

void save_clip_tokenizer(const BpeVocabulary& vocab, const std::string& dir, int model_max_length) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw IoError("cannot create tokenizer folder '" + dir + "'");
  nlohmann::ordered_json v = nlohmann::ordered_json::object();
  for (size_t i = 0; i < vocab.tokens.size(); ++i) v[vocab.tokens[i]] = i;
  io::write_file_atomically((fs::path(dir) / "vocab.json").string(), [&](std::ostream& out) { out << v.dump(); });
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
  io::write_file_atomically((fs::path(dir) / "special_tokens_map.json").string(),
                            [&](std::ostream& out) { out << special.dump(2) << "\n"; });
  io::write_file_atomically((fs::path(dir) / "tokenizer_config.json").string(),
                            [&](std::ostream& out) { out << config.dump(2) << "\n"; });
}

}  // namespace diffuse::text
