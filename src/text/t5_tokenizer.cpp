#include "text/t5_tokenizer.h"

#include <filesystem>
#include <map>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "text/unicode.h"

namespace fs = std::filesystem;

namespace diffuse::text {
namespace {

const std::string kExtraPrefix = "<extra_id_";

// N for "<extra_id_N>", else -1.
int64_t extra_id_index(const std::string& token) {
  if (token.size() <= kExtraPrefix.size() + 1 ||
      token.compare(0, kExtraPrefix.size(), kExtraPrefix) != 0 || token.back() != '>')
    return -1;
  const std::string digits =
      token.substr(kExtraPrefix.size(), token.size() - kExtraPrefix.size() - 1);
  if (digits.empty() || digits.size() > 6 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(digits);
}

}  // namespace

int64_t T5Tokenizer::token_to_id(const std::string& token) const {
  for (const auto& t : added_)
    if (t.content == token) return t.id;
  return sp_->piece_to_id(token);
}

T5Tokenizer T5Tokenizer::from_folder(const std::string& dir_str) {
  const fs::path dir(dir_str);
  const fs::path model_path = dir / "spiece.model";
  if (!fs::exists(model_path))
    throw IoError("T5 tokenizer folder '" + dir_str + "' has no spiece.model");
  T5Tokenizer t;
  t.sp_ = SentencePieceModel::load(model_path.string());
  const int64_t pieces = t.sp_->piece_size();

  // T5Tokenizer's defaults, overridden by tokenizer_config.json, then special_tokens_map.json.
  std::map<std::string, AddedToken> special = {
      {"eos_token", {"</s>"}}, {"unk_token", {"<unk>"}}, {"pad_token", {"<pad>"}}};
  std::vector<AddedToken> additional;
  int64_t extra_ids = 100;
  for (const char* file : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (!fs::exists(dir / file)) continue;
    const auto cfg = io::JsonConfig::load((dir / file).string());
    for (auto& [key, tok] : special) {
      AddedToken parsed;
      if (cfg.has(key) &&
          parse_added_token_json(cfg.json()[key], cfg.source() + ": " + key, parsed))
        tok = parsed;
    }
    if (cfg.has("additional_special_tokens")) {
      const auto& list = cfg.json()["additional_special_tokens"];
      if (!list.is_array()) cfg.fail("additional_special_tokens", "expected a list");
      additional.clear();
      for (const auto& v : list) {
        AddedToken tok;
        if (parse_added_token_json(v, cfg.source() + ": additional_special_tokens", tok))
          additional.push_back(tok);
      }
    }
    extra_ids = cfg.get<int64_t>("extra_ids", extra_ids);
    if (extra_ids < 0 || extra_ids > 100000)
      cfg.fail("extra_ids", "expected 0..100000, got " + std::to_string(extra_ids));
    if (cfg.has("model_max_length")) {
      const double n = cfg.get<double>("model_max_length", 0);
      // Configs without a limit write a huge sentinel; keep the T5 default then.
      if (n >= 1 && n <= 1e6) t.model_max_length_ = static_cast<int64_t>(n);
    }
    if (cfg.has("legacy") && !cfg.get<bool>("legacy", true))
      cfg.fail("legacy",
               "legacy=false (T5Tokenizer's non-legacy prefix handling) is not supported");
  }
  t.vocab_size_ = pieces + extra_ids;

  // Ids: the extra ids count down from the end of the vocabulary (<extra_id_0> is the last id),
  // every other special token must be a SentencePiece piece.
  auto resolve = [&](AddedToken tok, const std::string& what) {
    const int64_t extra = extra_id_index(tok.content);
    if (extra >= 0 && extra < extra_ids) {
      tok.id = pieces + extra_ids - 1 - extra;
      // T5Tokenizer registers the extra ids with lstrip and rstrip.
      tok.lstrip = tok.rstrip = true;
    } else {
      tok.id = t.sp_->piece_to_id(tok.content);
      if (tok.id == t.sp_->unk_id() && tok.content != t.sp_->id_to_piece(t.sp_->unk_id()))
        throw ConfigError(
            dir_str + ": " + what + " '" + tok.content +
            "' is neither a SentencePiece piece of spiece.model nor an <extra_id_N> (N < " +
            std::to_string(extra_ids) + ")");
    }
    return tok;
  };
  for (int64_t i = 0; i < extra_ids; ++i)
    t.added_.push_back(resolve({kExtraPrefix + std::to_string(i) + ">"}, "extra id"));
  for (const auto& [key, tok] : special) t.added_.push_back(resolve(tok, key));
  for (const auto& tok : additional)
    if (extra_id_index(tok.content) < 0 || extra_id_index(tok.content) >= extra_ids)
      t.added_.push_back(resolve(tok, "additional special token"));
  t.eos_id_ = t.token_to_id(special["eos_token"].content);
  t.pad_id_ = t.token_to_id(special["pad_token"].content);
  t.unk_id_ = t.token_to_id(special["unk_token"].content);
  for (const auto& tok : t.added_) t.added_u32_.push_back(utf8_decode(tok.content));
  return t;
}

std::vector<int64_t> T5Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const auto& piece : split_added_tokens(utf8_decode(text), added_, added_u32_)) {
    if (piece.text.empty()) continue;
    if (piece.token >= 0) {
      ids.push_back(added_[static_cast<size_t>(piece.token)].id);
      continue;
    }
    const auto piece_ids = sp_->encode(utf8_encode(piece.text));
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  }
  if (ids.empty() || ids.back() != eos_id_) ids.push_back(eos_id_);
  return ids;
}

TokenBatch T5Tokenizer::encode_padded(const std::vector<std::string>& texts,
                                      int64_t max_length) const {
  if (max_length < 0) max_length = model_max_length_;
  if (max_length < 1)
    throw InvalidArgument("T5 tokenizer: max_length " + std::to_string(max_length) +
                          " leaves no room for </s> (need >= 1)");
  const auto n = static_cast<size_t>(max_length);
  TokenBatch batch;
  for (const auto& text : texts) {
    auto ids = encode(text);
    const bool truncated = ids.size() > n;
    if (truncated) {
      // transformers truncates the text's ids to max_length-1, then adds </s> unless the kept
      // part already ends with it.
      ids.resize(n - 1);
      if (ids.empty() || ids.back() != eos_id_) ids.push_back(eos_id_);
    }
    batch.push_right_padded(std::move(ids), n, pad_id_, truncated);
  }
  return batch;
}

}  // namespace diffuse::text
