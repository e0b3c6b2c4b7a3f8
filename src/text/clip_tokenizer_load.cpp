// Loading a CLIP tokenizer folder the way transformers' CLIPTokenizer.from_pretrained does.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "text/clip_tokenizer.h"
#include "text/tokenizer_files.h"
#include "text/unicode.h"

namespace fs = std::filesystem;

namespace diffuse::text {
namespace {

// CLIPTokenizer reads at most this many merges (49152 BPE tokens - 256 byte tokens - 2
// special tokens); the rest of a longer merges.txt is ignored.
constexpr size_t kMaxMerges = 49152 - 256 - 2;

// transformers' special token attributes, in the order it registers them.
const char* const kSpecialKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                    "pad_token", "cls_token", "mask_token"};

// Python's str.split(): fields separated by runs of ASCII whitespace.
std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> out;
  const char* ws = " \t\r\f\v";
  for (size_t pos = line.find_first_not_of(ws); pos != std::string_view::npos;) {
    size_t end = line.find_first_of(ws, pos);
    if (end == std::string_view::npos) end = line.size();
    out.push_back(line.substr(pos, end - pos));
    pos = line.find_first_not_of(ws, end);
  }
  return out;
}

}  // namespace

// Stand-ins for the 256 byte values (GPT-2/CLIP bytes_to_unicode): printable Latin-1 bytes
// stand for themselves, the others are mapped in order to U+0100, U+0101, ...
std::array<std::string, 256> clip_byte_characters() {
  std::array<std::string, 256> out;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    out[static_cast<size_t>(b)] = utf8_encode(printable ? static_cast<char32_t>(b) : next++);
  }
  return out;
}

class ClipTokenizerLoader {
 public:
  static ClipTokenizer load(const std::string& dir_str) {
    const fs::path dir(dir_str);
    if (!fs::is_directory(dir)) throw IoError("tokenizer folder '" + dir_str + "' does not exist");
    ClipTokenizer t;
    t.byte_chars_ = clip_byte_characters();
    load_vocab(dir / "vocab.json", t);
    load_merges(dir / "merges.txt", t);

    // Special tokens: CLIPTokenizer's defaults, overridden by tokenizer_config.json, overridden
    // by special_tokens_map.json (transformers lets the map file win).
    std::map<std::string, ClipTokenizer::AddedToken> special = {{"bos_token", {"<|startoftext|>"}},
                                                                {"eos_token", {"<|endoftext|>"}},
                                                                {"unk_token", {"<|endoftext|>"}},
                                                                {"pad_token", {"<|endoftext|>"}}};
    std::vector<ClipTokenizer::AddedToken> additional;
    const fs::path config_path = dir / "tokenizer_config.json";
    io::JsonConfig config;
    if (fs::exists(config_path)) {
      config = io::JsonConfig::load(config_path.string());
      read_special(config, special, additional);
      read_model_max_length(config, t);
      read_added_tokens_decoder(config, t);
    }
    const fs::path map_path = dir / "special_tokens_map.json";
    if (fs::exists(map_path)) {
      auto map = io::JsonConfig::load(map_path.string());
      read_special(map, special, additional);
    }
    const fs::path added_path = dir / "added_tokens.json";
    if (fs::exists(added_path) && !config.has("added_tokens_decoder"))
      read_added_tokens_json(io::JsonConfig::load(added_path.string()), t);

    for (const char* key : kSpecialKeys) {
      auto it = special.find(key);
      if (it != special.end()) register_token(it->second, t);
    }
    for (const auto& tok : additional) register_token(tok, t);

    t.bos_id_ = t.token_to_id(special["bos_token"].content);
    t.eos_id_ = t.token_to_id(special["eos_token"].content);
    t.unk_id_ = t.token_to_id(special["unk_token"].content);
    t.pad_id_ = t.token_to_id(special["pad_token"].content);
    for (const auto& tok : t.added_) t.added_u32_.push_back(utf8_decode(tok.content));
    return t;
  }

 private:
  static void load_vocab(const fs::path& path, ClipTokenizer& t) {
    read_vocab_json(path, t.vocab_);
    if (t.vocab_.empty())
      throw FormatError(path.string() + ": expected a non-empty JSON object token -> id");
    // Two tokens with one id would decode ambiguously and point at one embedding row.
    std::unordered_map<int64_t, const std::string*> by_id;
    by_id.reserve(t.vocab_.size());
    for (const auto& [token, id] : t.vocab_) {
      auto [it, fresh] = by_id.emplace(id, &token);
      if (!fresh)
        throw FormatError(path.string() + ": id " + std::to_string(id) + " is given to both '" +
                          *it->second + "' and '" + token + "'");
    }
  }

  static void load_merges(const fs::path& path, ClipTokenizer& t) {
    const std::string text = read_tokenizer_file(path);
    // Like CLIPTokenizer, the first line (the "#version: ..." header) is skipped without looking
    // at it, and blank lines at the end of the file do not count.
    std::vector<std::string_view> lines;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      lines.emplace_back(text.data() + pos, end - pos);
      pos = end + 1;
    }
    while (!lines.empty() && split_fields(lines.back()).empty()) lines.pop_back();
    if (lines.size() < 2) throw FormatError(path.string() + ": no merges after the header line");
    const size_t count = std::min(lines.size() - 1, kMaxMerges);
    t.merge_ranks_.reserve(count);
    for (size_t rank = 0; rank < count; ++rank) {
      const auto fields = split_fields(lines[rank + 1]);
      if (fields.size() != 2)
        throw FormatError(path.string() + ": line " + std::to_string(rank + 2) +
                          ": expected two space-separated symbols, got '" +
                          std::string(lines[rank + 1]) + "'");
      // Each merge joins two vocabulary tokens into a third; one that does not (binary
      // garbage, a merges.txt from another tokenizer) would make unknown tokens silently.
      for (const auto& symbol : {fields[0], fields[1]})
        if (!t.vocab_.count(std::string(symbol)))
          throw FormatError(path.string() + ": line " + std::to_string(rank + 2) + ": symbol '" +
                            std::string(symbol) +
                            "' is not in vocab.json (merges.txt and vocab.json must come from "
                            "the same tokenizer)");
      if (!t.vocab_.count(std::string(fields[0]) + std::string(fields[1])))
        throw FormatError(path.string() + ": line " + std::to_string(rank + 2) +
                          ": merged token '" + std::string(fields[0]) + std::string(fields[1]) +
                          "' is not in vocab.json (merges.txt and vocab.json must come from the "
                          "same tokenizer)");
      // A repeated pair keeps its last rank, as Python's dict(zip(merges, range(n))) does.
      std::string key;
      key.reserve(fields[0].size() + fields[1].size() + 1);
      key.append(fields[0]).append(" ").append(fields[1]);
      t.merge_ranks_[std::move(key)] = static_cast<int>(rank);
    }
  }

  static void read_special(const io::JsonConfig& cfg,
                           std::map<std::string, ClipTokenizer::AddedToken>& special,
                           std::vector<ClipTokenizer::AddedToken>& additional) {
    for (const char* key : kSpecialKeys) {
      if (!cfg.has(key)) continue;
      ClipTokenizer::AddedToken tok;
      if (parse_added_token_json(cfg.json()[key], cfg.source() + ": " + key, tok))
        special[key] = tok;
    }
    if (cfg.has("additional_special_tokens")) {
      const auto& list = cfg.json()["additional_special_tokens"];
      if (!list.is_array())
        cfg.fail("additional_special_tokens", "expected a list of tokens, got " + list.dump());
      additional.clear();
      for (const auto& v : list) {
        ClipTokenizer::AddedToken tok;
        if (parse_added_token_json(v, cfg.source() + ": additional_special_tokens", tok))
          additional.push_back(tok);
      }
    }
  }

  static void read_model_max_length(const io::JsonConfig& cfg, ClipTokenizer& t) {
    if (!cfg.has("model_max_length")) return;
    const auto& v = cfg.json()["model_max_length"];
    const double n = v.is_number() ? v.get<double>() : -1;
    if (!(n >= 2 && n <= 1e6 && std::floor(n) == n))
      cfg.fail("model_max_length", "expected an integer in [2, 1000000], got " + v.dump());
    t.model_max_length_ = static_cast<int64_t>(n);
  }

  // Newer tokenizer_config.json files list every added token with its id.
  static void read_added_tokens_decoder(const io::JsonConfig& cfg, ClipTokenizer& t) {
    if (!cfg.has("added_tokens_decoder")) return;
    const auto& dec = cfg.json()["added_tokens_decoder"];
    if (!dec.is_object()) cfg.fail("added_tokens_decoder", "expected an object id -> token");
    for (const auto& [id_str, v] : dec.items()) {
      ClipTokenizer::AddedToken tok;
      const std::string where = cfg.source() + ": added_tokens_decoder." + id_str;
      if (!parse_added_token_json(v, where, tok)) continue;
      try {
        size_t used = 0;
        tok.id = std::stoll(id_str, &used);
        if (used != id_str.size() || tok.id < 0) throw std::invalid_argument(id_str);
      } catch (const std::exception&) {
        throw ConfigError(where + ": the key must be a non-negative integer id");
      }
      add(tok, t);
    }
  }

  static void read_added_tokens_json(const io::JsonConfig& cfg, ClipTokenizer& t) {
    for (const auto& [content, id] : cfg.json().items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0)
        cfg.fail(content, "expected a non-negative integer id, got " + id.dump());
      ClipTokenizer::AddedToken tok;
      tok.content = content;
      tok.id = id.get<int64_t>();
      add(tok, t);
    }
  }

  // A special token joins the added tokens unless its text already is one; its id is the
  // vocabulary's, or the next free id after the vocabulary and the added tokens.
  static void register_token(ClipTokenizer::AddedToken tok, ClipTokenizer& t) {
    if (tok.content.empty() || t.added_ids_.count(tok.content)) return;
    auto it = t.vocab_.find(tok.content);
    if (it != t.vocab_.end()) {
      tok.id = it->second;
    } else {
      int64_t next = static_cast<int64_t>(t.vocab_.size());
      for (const auto& a : t.added_) next = std::max(next, a.id + 1);
      tok.id = next;
    }
    add(tok, t);
  }

  static void add(const ClipTokenizer::AddedToken& tok, ClipTokenizer& t) {
    if (tok.content.empty()) return;
    for (auto& a : t.added_) {
      if (a.content == tok.content) {
        a = tok;
        t.added_ids_[tok.content] = tok.id;
        return;
      }
    }
    t.added_.push_back(tok);
    t.added_ids_[tok.content] = tok.id;
  }
};

std::pair<std::string, int64_t> ClipTokenizer::largest_id_token() const {
  std::pair<std::string, int64_t> best{"", -1};
  for (const auto& [token, id] : vocab_)
    if (id > best.second) best = {token, id};
  for (const auto& a : added_)
    if (a.id > best.second) best = {a.content, a.id};
  return best;
}

ClipTokenizer ClipTokenizer::from_folder(const std::string& dir) {
  return ClipTokenizerLoader::load(dir);
}

}  // namespace diffuse::text
