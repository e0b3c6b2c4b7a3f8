// Qwen2Tokenizer (transformers models/qwen2/tokenization_qwen2.py, and the fast tokenizer built
// from the same files): the byte-level BPE of LlamaTokenizer read from vocab.json +
// merges.txt, text NFC-normalised first, Qwen2's pre-tokenizer regex, the added tokens of
// tokenizer_config.json's added_tokens_decoder (or added_tokens.json), no special tokens added
// around a text (add_bos_token false), eos / pad from the configs.
#include <filesystem>
#include <sstream>
#include <string_view>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "text/clip_tokenizer.h"
#include "text/llama_tokenizer.h"
#include "text/pretokenizer_regex.h"
#include "text/tokenizer_files.h"
#include "text/unicode.h"

namespace fs = std::filesystem;

namespace diffuse::text {
namespace {

// tokenization_qwen2.py's PRETOKENIZE_REGEX (the fast tokenizer's Split pattern is the same).
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Every added token of the folder: tokenizer_config.json's added_tokens_decoder {"id": {...}},
// else added_tokens.json {"content": id}.
std::vector<AddedToken> read_added_tokens(const fs::path& dir) {
  std::vector<AddedToken> out;
  if (fs::exists(dir / "tokenizer_config.json")) {
    const auto cfg = io::JsonConfig::load((dir / "tokenizer_config.json").string());
    if (cfg.has("added_tokens_decoder")) {
      const auto& dec = cfg.json()["added_tokens_decoder"];
      if (!dec.is_object()) cfg.fail("added_tokens_decoder", "expected an object id -> token");
      for (const auto& [id_text, value] : dec.items()) {
        AddedToken tok;
        const std::string where = cfg.source() + ": added_tokens_decoder." + id_text;
        if (!parse_added_token_json(value, where, tok) || tok.content.empty())
          throw ConfigError(where + ": expected a token with a non-empty content");
        try {
          size_t used = 0;
          tok.id = std::stoll(id_text, &used);
          if (used != id_text.size() || tok.id < 0) throw std::invalid_argument(id_text);
        } catch (const std::exception&) {
          throw ConfigError(where + ": the key is not a token id");
        }
        out.push_back(tok);
      }
      return out;
    }
  }
  if (fs::exists(dir / "added_tokens.json")) {
    const auto added = io::JsonConfig::load((dir / "added_tokens.json").string());
    if (!added.json().is_object())
      throw FormatError(added.source() + ": expected an object token -> id");
    for (const auto& [content, id] : added.json().items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || content.empty())
        throw FormatError(added.source() + ": token '" + content +
                          "' needs a non-negative integer id");
      AddedToken tok;
      tok.content = content;
      tok.id = id.get<int64_t>();
      out.push_back(tok);
    }
  }
  return out;
}

}  // namespace

LlamaTokenizer load_qwen2_tokenizer(const std::string& dir_str) {
  const fs::path dir(dir_str);
  for (const char* file : {"vocab.json", "merges.txt"})
    if (!fs::exists(dir / file))
      throw IoError("Qwen2 tokenizer folder '" + dir_str + "' has no " + file);
  LlamaTokenizer t;
  t.nfc_ = true;
  t.byte_chars_ = clip_byte_characters();
  read_vocab_json(dir / "vocab.json", t.vocab_);
  const std::string vocab_where = (dir / "vocab.json").string();
  for (int b = 0; b < 256; ++b) {
    auto it = t.vocab_.find(t.byte_chars_[static_cast<size_t>(b)]);
    if (it == t.vocab_.end())
      throw FormatError(vocab_where + " lacks the byte token '" +
                        t.byte_chars_[static_cast<size_t>(b)] + "' (byte " + std::to_string(b) +
                        "); byte-level BPE needs all 256");
    t.byte_ids_[static_cast<size_t>(b)] = it->second;
  }

  // merges.txt: "#version" header, then "left right" per line in rank order.
  const std::string merges_where = (dir / "merges.txt").string();
  std::istringstream lines(read_tokenizer_file(dir / "merges.txt"));
  std::string line;
  int32_t rank = 0;
  size_t line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      throw FormatError(merges_where + ": line " + std::to_string(line_no) + " '" + line +
                        "' is not two tokens");
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    auto id_of = [&](const std::string& tok) {
      auto it = t.vocab_.find(tok);
      if (it == t.vocab_.end())
        throw FormatError(merges_where + ": line " + std::to_string(line_no) + " references '" +
                          tok + "', which is not in vocab.json");
      return it->second;
    };
    const uint64_t key =
        (static_cast<uint64_t>(id_of(left)) << 32) | static_cast<uint64_t>(id_of(right));
    t.merges_.emplace(key, std::make_pair(rank++, id_of(left + right)));
  }
  t.regex_ = std::make_unique<PretokenizerRegex>(kQwen2Pattern, "Qwen2Tokenizer");

  for (auto& tok : read_added_tokens(dir)) {
    t.vocab_[tok.content] = tok.id;
    t.added_.push_back(tok);
  }
  for (const auto& tok : t.added_) t.added_u32_.push_back(utf8_decode(tok.content));

  for (const char* file : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (!fs::exists(dir / file)) continue;
    const auto cfg = io::JsonConfig::load((dir / file).string());
    if (cfg.has("add_bos_token") && cfg.get<bool>("add_bos_token", false))
      cfg.fail("add_bos_token", "Qwen2 tokenizers add no BOS (expected false)");
  }
  t.read_special_tokens(dir_str, "the folder");
  return t;
}

}  // namespace diffuse::text
