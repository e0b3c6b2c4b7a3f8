#include "text/llama_tokenizer.h"

#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "text/clip_tokenizer.h"
#include "text/pretokenizer_regex.h"
#include "text/tokenizer_files.h"
#include "text/unicode.h"

namespace fs = std::filesystem;

namespace diffuse::text {

namespace {

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key))
    throw FormatError(where + ": missing field '" + key + "'");
  return j[key];
}

// The Split pre-tokenizer's regex from a tokenizer.json pre_tokenizer, checking that the rest
// is what byte-level BPE expects (ByteLevel without its own regex).
std::string split_pattern(const nlohmann::json& pre, const std::string& where) {
  std::vector<nlohmann::json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence")
    for (const auto& p : field(pre, "pretokenizers", where)) steps.push_back(p);
  else
    steps.push_back(pre);
  std::string pattern;
  bool byte_level = false;
  for (const auto& p : steps) {
    const std::string type = p.is_object() ? p.value("type", "") : "";
    if (type == "Split") {
      const auto& pat = field(p, "pattern", where + ".Split");
      if (!pat.is_object() || !pat.contains("Regex") || !pat["Regex"].is_string())
        throw ConfigError(where + ".Split.pattern: expected {\"Regex\": \"...\"}");
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
        throw ConfigError(where + ".Split: only behavior Isolated without invert is supported");
      pattern = pat["Regex"].get<std::string>();
    } else if (type == "ByteLevel") {
      if (p.value("use_regex", true) || p.value("add_prefix_space", false))
        throw ConfigError(where +
                          ".ByteLevel: only use_regex=false, add_prefix_space=false is supported");
      byte_level = true;
    } else {
      throw ConfigError(where + ": unsupported pre-tokenizer '" + (type.empty() ? p.dump() : type) +
                        "' (expected Split + ByteLevel)");
    }
  }
  if (pattern.empty() || !byte_level)
    throw ConfigError(where + ": expected a Split (Regex) and a ByteLevel step");
  return pattern;
}

}  // namespace

LlamaTokenizer::LlamaTokenizer() = default;
LlamaTokenizer::~LlamaTokenizer() = default;
LlamaTokenizer::LlamaTokenizer(LlamaTokenizer&&) noexcept = default;
LlamaTokenizer& LlamaTokenizer::operator=(LlamaTokenizer&&) noexcept = default;

LlamaTokenizer LlamaTokenizer::from_folder(const std::string& dir_str) {
  const fs::path dir(dir_str);
  const fs::path path = dir / "tokenizer.json";
  if (!fs::exists(path)) throw IoError("tokenizer folder '" + dir_str + "' has no tokenizer.json");
  const std::string where = path.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_tokenizer_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(where + ": invalid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw FormatError(where + ": expected a JSON object");
  // A field of another type than the one read (e.g. "ignore_merges": "yes") makes nlohmann's
  // value()/get() throw its type_error: a FormatError naming the file, like every other defect.
  try {
    LlamaTokenizer t;
    t.byte_chars_ = clip_byte_characters();

    // model: byte-level BPE.
    const auto& model = field(j, "model", where);
    const std::string type = model.is_object() ? model.value("type", "") : "";
    if (type != "BPE")
      throw ConfigError(where + ": model.type '" +
                        (type.empty() ? model.dump().substr(0, 40) : type) +
                        "' is not supported (expected BPE)");
    if (model.value("byte_fallback", false) ||
        (model.contains("dropout") && !model["dropout"].is_null()) ||
        (model.contains("continuing_subword_prefix") &&
         !model["continuing_subword_prefix"].is_null()) ||
        (model.contains("end_of_word_suffix") && !model["end_of_word_suffix"].is_null()))
      throw ConfigError(
          where +
          ": model: byte_fallback, dropout and subword prefixes/suffixes are not supported");
    t.ignore_merges_ = model.value("ignore_merges", false);
    const auto& vocab = field(model, "vocab", where + ": model");
    if (!vocab.is_object())
      throw FormatError(where + ": model.vocab: expected an object token -> id");
    t.vocab_.reserve(vocab.size());
    for (const auto& [token, id] : vocab.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0)
        throw FormatError(where + ": model.vocab: token '" + token +
                          "' has no non-negative integer id");
      t.vocab_.emplace(token, id.get<int64_t>());
    }
    for (int b = 0; b < 256; ++b) {
      auto it = t.vocab_.find(t.byte_chars_[static_cast<size_t>(b)]);
      if (it == t.vocab_.end())
        throw FormatError(where + ": model.vocab lacks the byte token '" +
                          t.byte_chars_[static_cast<size_t>(b)] + "' (byte " + std::to_string(b) +
                          "); byte-level BPE needs all 256");
      t.byte_ids_[static_cast<size_t>(b)] = it->second;
    }
    const auto& merges = field(model, "merges", where + ": model");
    if (!merges.is_array()) throw FormatError(where + ": model.merges: expected a list");
    t.merges_.reserve(merges.size());
    auto id_of = [&](const std::string& tok, size_t rank) {
      auto it = t.vocab_.find(tok);
      if (it == t.vocab_.end())
        throw FormatError(where + ": merge " + std::to_string(rank) + " references '" + tok +
                          "', which is not in model.vocab");
      return it->second;
    };
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      std::string left, right;
      const auto& m = merges[rank];
      if (m.is_string()) {  // "left right"
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          throw FormatError(where + ": merge " + std::to_string(rank) + " '" + s +
                            "' is not two tokens");
        left = s.substr(0, space), right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() &&
                 m[1].is_string()) {  // ["left", "right"]
        left = m[0].get<std::string>(), right = m[1].get<std::string>();
      } else {
        throw FormatError(where + ": merge " + std::to_string(rank) +
                          " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      const uint64_t key = (static_cast<uint64_t>(id_of(left, rank)) << 32) |
                           static_cast<uint64_t>(id_of(right, rank));
      t.merges_.emplace(key, std::make_pair(static_cast<int32_t>(rank), id_of(left + right, rank)));
    }

    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      if (j["normalizer"].value("type", std::string()) != "NFC")
        throw ConfigError(where + ": normalizer " +
                          j["normalizer"].value("type", std::string("?")) +
                          " is not supported (byte-level BPE folders have none, or NFC)");
      t.nfc_ = true;
    }
    const std::string pattern =
        split_pattern(field(j, "pre_tokenizer", where), where + ": pre_tokenizer");
    t.regex_ = std::make_unique<PretokenizerRegex>(pattern, where + ": pre_tokenizer");

    // Added tokens, matched literally before the regex.
    if (j.contains("added_tokens")) {
      if (!j["added_tokens"].is_array())
        throw FormatError(where + ": added_tokens: expected a list");
      for (const auto& a : j["added_tokens"]) {
        AddedToken tok;
        if (!parse_added_token_json(a, where + ": added_tokens", tok) || !a.contains("id") ||
            !a["id"].is_number_integer())
          throw FormatError(where +
                            ": added_tokens: every entry needs \"content\" and an integer \"id\"");
        tok.id = a["id"].get<int64_t>();
        if (tok.content.empty())
          throw FormatError(where + ": added_tokens: empty content for id " +
                            std::to_string(tok.id));
        t.added_.push_back(tok);
        t.vocab_.emplace(tok.content, tok.id);
      }
    }
    for (const auto& tok : t.added_) t.added_u32_.push_back(utf8_decode(tok.content));

    // Post-processor: the TemplateProcessing "single" template's special tokens around $A.
    std::vector<nlohmann::json> processors;
    if (j.contains("post_processor") && j["post_processor"].is_object()) {
      const auto& pp = j["post_processor"];
      if (pp.value("type", "") == "Sequence")
        for (const auto& p : field(pp, "processors", where + ": post_processor"))
          processors.push_back(p);
      else
        processors.push_back(pp);
    }
    for (const auto& p : processors) {
      const std::string ptype = p.value("type", "");
      if (ptype == "ByteLevel") continue;  // offsets only
      if (ptype != "TemplateProcessing")
        throw ConfigError(where + ": post_processor '" + ptype +
                          "' is not supported (expected TemplateProcessing)");
      bool seen_sequence = false;
      for (const auto& item : field(p, "single", where + ": post_processor")) {
        if (item.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        const std::string name =
            item.contains("SpecialToken") ? item["SpecialToken"].value("id", "") : "";
        const auto& specials = field(p, "special_tokens", where + ": post_processor");
        if (name.empty() || !specials.contains(name) || !specials[name].contains("ids") ||
            !specials[name]["ids"].is_array())
          throw FormatError(where + ": post_processor: template item " + item.dump() +
                            " names no special token");
        for (const auto& id : specials[name]["ids"])
          (seen_sequence ? t.suffix_ : t.prefix_).push_back(id.get<int64_t>());
      }
    }

    t.read_special_tokens(dir_str, "tokenizer.json");
    return t;
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(where + ": a field has the wrong type (" + e.what() + ")");
  }
}

void LlamaTokenizer::read_special_tokens(const std::string& dir_str,
                                         const std::string& vocab_source) {
  const fs::path dir(dir_str);
  // eos / pad / model_max_length from the transformers configs (special_tokens_map.json wins).
  std::string eos, pad;
  for (const char* file : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (!fs::exists(dir / file)) continue;
    const auto cfg = io::JsonConfig::load((dir / file).string());
    AddedToken tok;
    if (cfg.has("eos_token") &&
        parse_added_token_json(cfg.json()["eos_token"], cfg.source() + ": eos_token", tok))
      eos = tok.content;
    if (cfg.has("pad_token") &&
        parse_added_token_json(cfg.json()["pad_token"], cfg.source() + ": pad_token", tok))
      pad = tok.content;
    if (cfg.has("model_max_length")) {
      const double n = cfg.get<double>("model_max_length", 0);
      if (n >= 1 && n <= 1e9) model_max_length_ = static_cast<int64_t>(n);
    }
  }
  auto special_id = [&](const std::string& content, const char* what) -> int64_t {
    if (content.empty()) return -1;
    auto it = vocab_.find(content);
    if (it == vocab_.end())
      throw ConfigError(dir_str + ": " + what + " '" + content + "' is not a token of " +
                        vocab_source);
    return it->second;
  };
  eos_id_ = special_id(eos, "eos_token");
  pad_id_ = pad.empty() ? eos_id_ : special_id(pad, "pad_token");
}

void LlamaTokenizer::bpe(std::string_view piece, std::vector<int64_t>& out) const {
  if (ignore_merges_) {
    std::string chars;
    for (unsigned char b : piece) chars += byte_chars_[b];
    if (auto it = vocab_.find(chars); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int64_t> symbols;
  symbols.reserve(piece.size());
  for (unsigned char b : piece) symbols.push_back(byte_ids_[b]);
  // Repeatedly merge the adjacent pair of lowest rank (the leftmost on ties).
  while (symbols.size() > 1) {
    int32_t best = INT32_MAX;
    size_t best_i = 0;
    int64_t merged = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merges_.find((static_cast<uint64_t>(symbols[i]) << 32) |
                             static_cast<uint64_t>(symbols[i + 1]));
      if (it != merges_.end() && it->second.first < best)
        best = it->second.first, best_i = i, merged = it->second.second;
    }
    if (best == INT32_MAX) break;
    symbols[best_i] = merged;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best_i) + 1);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

std::vector<int64_t> LlamaTokenizer::encode_ordinary(const std::string& text) const {
  std::vector<int64_t> ids;
  const std::u32string decoded = nfc_ ? nfc(utf8_decode(text)) : utf8_decode(text);
  for (const auto& piece : split_added_tokens(decoded, added_, added_u32_)) {
    if (piece.text.empty()) continue;
    if (piece.token >= 0) {
      ids.push_back(added_[static_cast<size_t>(piece.token)].id);
      continue;
    }
    // Valid UTF-8 is guaranteed by utf8_decode above.
    regex_->split(utf8_encode(piece.text), [&](std::string_view p) { bpe(p, ids); });
  }
  return ids;
}

std::vector<int64_t> LlamaTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids = prefix_;
  const auto body = encode_ordinary(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

TokenBatch LlamaTokenizer::encode_padded(const std::vector<std::string>& texts,
                                         int64_t max_length) const {
  if (max_length < 0) max_length = model_max_length_;
  const auto specials = static_cast<int64_t>(prefix_.size() + suffix_.size());
  if (max_length < specials)
    throw InvalidArgument("Llama tokenizer: max_length " + std::to_string(max_length) +
                          " leaves no room for the " + std::to_string(specials) +
                          " special tokens");
  if (pad_id_ < 0) throw InvalidArgument("Llama tokenizer: padding needs a pad_token or eos_token");
  TokenBatch batch;
  for (const auto& text : texts) {
    auto body = encode_ordinary(text);
    const bool truncated = static_cast<int64_t>(body.size()) > max_length - specials;
    if (truncated) body.resize(static_cast<size_t>(max_length - specials));
    std::vector<int64_t> ids = prefix_;
    ids.insert(ids.end(), body.begin(), body.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    batch.push_right_padded(std::move(ids), static_cast<size_t>(max_length), pad_id_, truncated);
  }
  return batch;
}

}  // namespace diffuse::text
