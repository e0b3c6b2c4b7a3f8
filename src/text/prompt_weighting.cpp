#include "text/prompt_weighting.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "diffuse/errors.h"
#include "text/clip_tokenizer.h"

namespace diffuse::text {
namespace {

constexpr double kRoundMultiplier = 1.1;
constexpr double kSquareMultiplier = 1 / 1.1;
constexpr size_t kCommaBacktrack = 20;

bool is_word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool is_space(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0;
}

// A1111's ":\s*([+-]?[.\d]+)\s*\)" at `pos` (exponents allowed, so that (a:1e3) is read as a
// number and clamped rather than as text); the number's text and the end of the match.
bool match_weight(const std::string& s, size_t pos, std::string* number, size_t* end) {
  if (s[pos] != ':') return false;
  size_t i = pos + 1;
  while (i < s.size() && is_space(s[i])) ++i;
  const size_t start = i;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  size_t digits = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.'))
    ++i, ++digits;
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    if (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) {
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      i = j;
    }
  }
  *number = s.substr(start, i - start);
  while (i < s.size() && is_space(s[i])) ++i;
  if (i >= s.size() || s[i] != ')') return false;
  *end = i + 1;
  return true;
}

// Splits `text` at each BREAK that stands as a word (re.split(r"\s*\bBREAK\b\s*")).
std::vector<std::string> split_breaks(const std::string& text) {
  std::vector<std::string> parts;
  size_t from = 0, search = 0;
  for (size_t at; (at = text.find("BREAK", search)) != std::string::npos;) {
    const size_t after = at + 5;
    const bool word = (at == 0 || !is_word_char(text[at - 1])) &&
                      (after == text.size() || !is_word_char(text[after]));
    if (!word) {
      search = at + 1;
      continue;
    }
    size_t left = at, right = after;
    while (left > from && is_space(text[left - 1])) --left;
    while (right < text.size() && is_space(text[right])) ++right;
    parts.push_back(text.substr(from, left - from));
    from = search = right;
  }
  parts.push_back(text.substr(from));
  return parts;
}

}  // namespace

std::vector<WeightedText> parse_prompt_attention(const std::string& prompt,
                                                 std::vector<std::string>* warnings) {
  std::vector<WeightedText> res;
  std::vector<size_t> round, square;
  auto multiply_range = [&](size_t start, double m) {
    for (size_t p = start; p < res.size(); ++p) res[p].weight *= m;
  };
  auto add_text = [&](const std::string& text) {
    const auto parts = split_breaks(text);
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i > 0) res.push_back({"", -1.0, true});
      res.push_back({parts[i], 1.0});
    }
  };
  const std::string& s = prompt;
  for (size_t pos = 0; pos < s.size();) {
    const char c = s[pos];
    std::string number;
    size_t end = 0;
    if (c == '\\') {
      // \( \) \[ \] \\ are those characters as text; a lone backslash is dropped.
      const bool escape =
          pos + 1 < s.size() && std::string("()[]\\").find(s[pos + 1]) != std::string::npos;
      if (escape) res.push_back({std::string(1, s[pos + 1]), 1.0});
      pos += escape ? 2 : 1;
    } else if (c == '(') {
      round.push_back(res.size());
      ++pos;
    } else if (c == '[') {
      square.push_back(res.size());
      ++pos;
    } else if (c == ':' && !round.empty() && match_weight(s, pos, &number, &end)) {
      const double w = std::strtod(number.c_str(), nullptr);
      multiply_range(round.back(), w);
      round.pop_back();
      pos = end;
    } else if (c == ')' && !round.empty()) {
      multiply_range(round.back(), kRoundMultiplier);
      round.pop_back();
      ++pos;
    } else if (c == ']' && !square.empty()) {
      multiply_range(square.back(), kSquareMultiplier);
      square.pop_back();
      ++pos;
    } else if (c == ':' || c == ')' || c == ']') {
      add_text(std::string(1, c));  // unbalanced or a plain colon: text, as in A1111
      ++pos;
    } else {
      const size_t stop = s.find_first_of("\\()[]:", pos);
      const size_t n = (stop == std::string::npos ? s.size() : stop) - pos;
      add_text(s.substr(pos, n));
      pos += n;
    }
  }
  for (size_t p : round) multiply_range(p, kRoundMultiplier);
  for (size_t p : square) multiply_range(p, kSquareMultiplier);
  // (x:1e3) or a thousand nested brackets: clamped, since such weights only wreck the image.
  for (auto& p : res) {
    if (p.is_break || (std::isfinite(p.weight) && std::fabs(p.weight) <= kMaxPromptWeight))
      continue;
    const double clamped = std::isnan(p.weight) ? 1.0 : std::copysign(kMaxPromptWeight, p.weight);
    if (warnings) {
      std::ostringstream os;
      os << "prompt weight " << p.weight << " of '" << p.text.substr(0, 40) << "' is outside [-"
         << kMaxPromptWeight << ", " << kMaxPromptWeight << "]: using " << clamped;
      warnings->push_back(os.str());
    }
    p.weight = clamped;
  }
  if (res.empty()) res.push_back({"", 1.0});
  // Neighbours of equal weight become one piece (so that plain text stays one piece).
  for (size_t i = 0; i + 1 < res.size();) {
    if (!res[i].is_break && !res[i + 1].is_break && res[i].weight == res[i + 1].weight) {
      res[i].text += res[i + 1].text;
      res.erase(res.begin() + static_cast<std::ptrdiff_t>(i + 1));
    } else {
      ++i;
    }
  }
  return res;
}

std::string plain_text(const std::vector<WeightedText>& parsed) {
  std::string text;
  for (const auto& p : parsed)
    if (!p.is_break) text += p.text;
  return text;
}

bool PromptChunk::all_weights_one() const {
  for (float w : weights)
    if (w != 1.0f) return false;
  return true;
}

std::vector<PromptChunk> chunk_prompt(const ClipTokenizer& tokenizer,
                                      const std::vector<WeightedText>& parsed) {
  const size_t length = static_cast<size_t>(tokenizer.model_max_length());
  const size_t body = length - 2;  // BOS and EOS around each chunk
  const int64_t comma = tokenizer.token_to_id(",</w>");
  std::vector<PromptChunk> chunks;
  std::vector<int64_t> ids;
  std::vector<float> weights;
  long last_comma = -1;
  auto next_chunk = [&] {
    if (chunks.size() == kMaxPromptChunks)
      throw InvalidArgument("prompt: more than " + std::to_string(kMaxPromptChunks) +
                            " chunks of " + std::to_string(body) +
                            " tokens (BREAKs and length together; at most " +
                            std::to_string(kMaxPromptChunks * body) + " tokens)");
    PromptChunk c;
    c.ids.push_back(tokenizer.bos_id());
    c.weights.push_back(1.0f);
    c.ids.insert(c.ids.end(), ids.begin(), ids.end());
    c.weights.insert(c.weights.end(), weights.begin(), weights.end());
    c.ids.push_back(tokenizer.eos_id());
    c.weights.push_back(1.0f);
    c.ids.resize(length, tokenizer.pad_id());
    c.weights.resize(length, 1.0f);
    chunks.push_back(std::move(c));
    ids.clear();
    weights.clear();
    last_comma = -1;
  };
  for (const auto& piece : parsed) {
    if (piece.is_break) {
      next_chunk();
      continue;
    }
    auto tokens = tokenizer.encode(piece.text);  // with BOS/EOS
    for (size_t i = 1; i + 1 < tokens.size(); ++i) {
      const int64_t t = tokens[i];
      if (t == comma && comma != tokenizer.unk_id()) {
        last_comma = static_cast<long>(ids.size());
      } else if (ids.size() == body && last_comma != -1 &&
                 ids.size() - static_cast<size_t>(last_comma) <= kCommaBacktrack) {
        // Move the words after the last comma to the next chunk.
        const size_t cut = static_cast<size_t>(last_comma) + 1;
        std::vector<int64_t> moved_ids(ids.begin() + static_cast<std::ptrdiff_t>(cut), ids.end());
        std::vector<float> moved_w(weights.begin() + static_cast<std::ptrdiff_t>(cut),
                                   weights.end());
        ids.resize(cut);
        weights.resize(cut);
        next_chunk();
        ids = std::move(moved_ids);
        weights = std::move(moved_w);
      }
      if (ids.size() == body) next_chunk();
      ids.push_back(t);
      weights.push_back(static_cast<float>(piece.weight));
    }
  }
  if (!ids.empty() || chunks.empty()) next_chunk();
  return chunks;
}

}  // namespace diffuse::text
