#include "text/clip_pretokenizer.h"

#include "text/unicode.h"

namespace diffuse::text {
namespace {

// transformers' _is_control: category C*, but \t \n \r count as whitespace instead.
bool is_control(char32_t c) {
  if (c == U'\t' || c == U'\n' || c == U'\r') return false;
  return is_other(c);
}

// transformers' _is_whitespace.
bool is_basic_whitespace(char32_t c) {
  return c == U' ' || c == U'\t' || c == U'\n' || c == U'\r' || is_space_separator(c);
}

// The "CJK Unified Ideographs" blocks that BasicTokenizer treats as one word per character
// (transformers' _is_chinese_char; it deliberately leaves out Hiragana, Katakana and Hangul).
bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Python's str.split() with no arguments.
std::vector<std::u32string> split_python_whitespace(const std::u32string& text) {
  std::vector<std::u32string> words;
  std::u32string cur;
  for (char32_t c : text) {
    if (is_python_space(c)) {
      if (!cur.empty()) words.push_back(std::move(cur));
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) words.push_back(std::move(cur));
  return words;
}

// The literal alternatives of the CLIP pattern, in the order the regex tries them.
const char32_t* const kLiterals[] = {
    U"<|startoftext|>", U"<|endoftext|>", U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};

// Length of the first literal alternative matching at `pos` (case-insensitively, like
// re.IGNORECASE: U+017F LONG S matches 's'), or 0.
size_t match_literal(const std::u32string& text, size_t pos) {
  for (const char32_t* lit : kLiterals) {
    size_t k = 0;
    while (lit[k] != 0 && pos + k < text.size() && simple_fold(text[pos + k]) == lit[k]) ++k;
    if (lit[k] == 0) return k;
  }
  return 0;
}

// [^\s\p{L}\p{N}] under re.IGNORECASE: a character is excluded when it or one of its case
// variants is in the class (so U+0345, whose upper case is a letter, matches nothing).
bool is_other_char(char32_t c) {
  return !is_white_space(c) && !is_letter(c) && !is_number(c) &&
         !has_letter_or_number_case_variant(c);
}

}  // namespace

std::u32string clip_basic_clean(const std::u32string& text) {
  std::u32string cleaned;
  cleaned.reserve(text.size() + 8);
  for (char32_t c : text) {
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_basic_whitespace(c)) {
      cleaned.push_back(U' ');
    } else if (is_cjk_ideograph(c)) {
      cleaned.push_back(U' ');
      cleaned.push_back(c);
      cleaned.push_back(U' ');
    } else {
      cleaned.push_back(c);
    }
  }
  std::u32string out;
  for (const auto& word : split_python_whitespace(nfc(cleaned))) {
    if (!out.empty()) out.push_back(U' ');
    out += to_lower(word);
  }
  return out;
}

std::vector<std::u32string> clip_split_words(const std::u32string& text) {
  std::vector<std::u32string> words;
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    size_t len = match_literal(text, i);
    if (len == 0 && is_letter(text[i])) {
      while (i + len < n && is_letter(text[i + len])) ++len;
    } else if (len == 0 && is_number(text[i])) {
      len = 1;
    } else if (len == 0 && is_other_char(text[i])) {
      while (i + len < n && is_other_char(text[i + len])) ++len;
    }
    if (len == 0) {
      ++i;  // whitespace (or a character no alternative accepts): findall skips it
      continue;
    }
    words.push_back(text.substr(i, len));
    i += len;
  }
  return words;
}

}  // namespace diffuse::text
