#include "text/added_tokens.h"

#include "diffuse/errors.h"
#include "text/unicode.h"

namespace diffuse::text {
namespace {

// Python's str.lstrip() / str.rstrip().
std::u32string lstrip(const std::u32string& s) {
  size_t i = 0;
  while (i < s.size() && is_python_space(s[i])) ++i;
  return s.substr(i);
}
std::u32string rstrip(const std::u32string& s) {
  size_t n = s.size();
  while (n > 0 && is_python_space(s[n - 1])) --n;
  return s.substr(0, n);
}

}  // namespace

// A special token value: a string or an AddedToken object {"content": ..., "lstrip": ...}.
// Returns false for null.
bool parse_added_token_json(const nlohmann::json& v, const std::string& where, AddedToken& out) {
  if (v.is_null()) return false;
  out = AddedToken();
  if (v.is_string()) {
    out.content = v.get<std::string>();
    return true;
  }
  if (!v.is_object() || !v.contains("content") || !v["content"].is_string())
    throw ConfigError(where + ": expected a string or an object with a string \"content\", got " +
                      v.dump());
  out.content = v["content"].get<std::string>();
  auto flag = [&](const char* key) {
    if (!v.contains(key) || v[key].is_null()) return false;
    if (!v[key].is_boolean()) throw ConfigError(where + "." + key + ": expected true or false");
    return v[key].get<bool>();
  };
  out.lstrip = flag("lstrip");
  out.rstrip = flag("rstrip");
  out.single_word = flag("single_word");
  return true;
}

std::vector<TextPiece> split_added_tokens(const std::u32string& chars,
                                          const std::vector<AddedToken>& added,
                                          const std::vector<std::u32string>& added_u32) {
  std::vector<TextPiece> pieces;
  size_t start = 0;
  for (size_t i = 0; i < chars.size();) {
    int best = -1;
    size_t best_len = 0;
    for (size_t k = 0; k < added_u32.size(); ++k) {
      const auto& tok = added_u32[k];
      if (tok.size() > best_len && chars.compare(i, tok.size(), tok) == 0)
        best = static_cast<int>(k), best_len = tok.size();
    }
    if (best < 0) {
      ++i;
      continue;
    }
    if (i > start) pieces.push_back({chars.substr(start, i - start), -1});
    pieces.push_back({added_u32[static_cast<size_t>(best)], best});
    i += best_len;
    start = i;
  }
  if (start < chars.size()) pieces.push_back({chars.substr(start), -1});
  // Whitespace stripping and single-word gluing around added tokens, in transformers' order.
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int t = pieces[i].token;
    if (t < 0 || pieces[i].text != added_u32[static_cast<size_t>(t)]) continue;
    const AddedToken& tok = added[static_cast<size_t>(t)];
    const bool has_left = i > 0 && !pieces[i - 1].text.empty();
    const bool has_right = i + 1 < pieces.size() && !pieces[i + 1].text.empty();
    if (tok.rstrip && has_right) pieces[i + 1].text = lstrip(pieces[i + 1].text);
    if (tok.lstrip && has_left) pieces[i - 1].text = rstrip(pieces[i - 1].text);
    if (tok.single_word && has_left && pieces[i - 1].text.back() != U' ') {
      pieces[i - 1].text += pieces[i].text;
      pieces[i].text.clear();
      pieces[i - 1].token = pieces[i].token = -1;
    } else if (tok.single_word && has_right && pieces[i + 1].text.front() != U' ') {
      pieces[i].text += pieces[i + 1].text;
      pieces[i + 1].text.clear();
      pieces[i].token = pieces[i + 1].token = -1;
    }
  }
  return pieces;
}

}  // namespace diffuse::text
