#include "text/unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "diffuse/errors.h"

namespace diffuse::text {
namespace {

std::u16string to_utf16(const std::u32string& text) {
  std::u16string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c >= 0x10000) {
      c -= 0x10000;
      out.push_back(static_cast<char16_t>(0xD800 + (c >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 + (c & 0x3FF)));
    } else {
      out.push_back(static_cast<char16_t>(c));
    }
  }
  return out;
}

std::u32string from_utf16(const char16_t* s, size_t n) {
  std::u32string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    char32_t c = s[i];
    if (c >= 0xD800 && c < 0xDC00 && i + 1 < n && s[i + 1] >= 0xDC00 && s[i + 1] < 0xE000) {
      c = 0x10000 + ((c - 0xD800) << 10) + (s[i + 1] - 0xDC00);
      ++i;
    }
    out.push_back(c);
  }
  return out;
}

void check(UErrorCode status, const char* what) {
  if (U_FAILURE(status))
    throw Error(std::string("ICU ") + what + " failed: " + u_errorName(status));
}

// Runs an ICU string transform that follows the preflighting convention (returns the needed
// length and U_BUFFER_OVERFLOW_ERROR when the destination is too small).
template <typename Fn>
std::u32string transform(const std::u32string& text, const char* what, Fn fn) {
  if (text.empty()) return text;
  std::u16string src = to_utf16(text);
  std::u16string dst(src.size() + 16, u'\0');
  UErrorCode status = U_ZERO_ERROR;
  int32_t n = fn(dst.data(), static_cast<int32_t>(dst.size()), src, &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    dst.assign(static_cast<size_t>(n), u'\0');
    status = U_ZERO_ERROR;
    n = fn(dst.data(), static_cast<int32_t>(dst.size()), src, &status);
  }
  check(status, what);
  return from_utf16(dst.data(), static_cast<size_t>(n));
}

bool category_in(char32_t c, uint32_t mask) {
  return (U_MASK(u_charType(static_cast<UChar32>(c))) & mask) != 0;
}

}  // namespace

std::u32string utf8_decode(const std::string& bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    size_t len = 0;
    char32_t c = 0;
    char32_t min = 0;
    if (b0 < 0x80) {
      len = 1, c = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2, c = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, c = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, c = b0 & 0x07, min = 0x10000;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(bytes[i + k]);
      ok = (b & 0xC0) == 0x80;
      c = (c << 6) | (b & 0x3F);
    }
    ok = ok && c >= min && c <= 0x10FFFF && !(c >= 0xD800 && c < 0xE000);
    if (!ok)
      throw InvalidArgument("text is not valid UTF-8: malformed sequence at byte " +
                            std::to_string(i));
    out.push_back(c);
    i += len;
  }
  return out;
}

std::string utf8_encode(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return out;
}

std::string utf8_encode(const std::u32string& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) out += utf8_encode(c);
  return out;
}

std::u32string nfc(const std::u32string& text) {
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* norm = unorm2_getNFCInstance(&status);
  check(status, "unorm2_getNFCInstance");
  return transform(text, "NFC normalisation",
                   [norm](UChar* dst, int32_t cap, const std::u16string& src, UErrorCode* st) {
                     return unorm2_normalize(norm, src.data(), static_cast<int32_t>(src.size()),
                                             dst, cap, st);
                   });
}

std::u32string to_lower(const std::u32string& text) {
  return transform(
      text, "lower-casing", [](UChar* dst, int32_t cap, const std::u16string& src, UErrorCode* st) {
        // "" is the root locale: no Turkish/Lithuanian tailoring, like Python.
        return u_strToLower(dst, cap, src.data(), static_cast<int32_t>(src.size()), "", st);
      });
}

bool is_letter(char32_t c) {
  return category_in(c, U_GC_L_MASK);
}
bool is_number(char32_t c) {
  return category_in(c, U_GC_N_MASK);
}
bool is_other(char32_t c) {
  return category_in(c, U_GC_C_MASK);
}
bool is_space_separator(char32_t c) {
  return category_in(c, U_GC_ZS_MASK);
}
bool is_white_space(char32_t c) {
  return u_isUWhiteSpace(static_cast<UChar32>(c));
}

bool is_python_space(char32_t c) {
  // CPython: bidirectional class WS, B or S, or category Zs. That is White_Space plus the
  // information separators U+001C..U+001F.
  return (c >= 0x1C && c <= 0x1F) || is_white_space(c);
}

bool has_letter_or_number_case_variant(char32_t c) {
  const auto u = static_cast<UChar32>(c);
  for (UChar32 v : {u_toupper(u), u_tolower(u), u_totitle(u), u_foldCase(u, U_FOLD_CASE_DEFAULT)}) {
    if (v != u && (is_letter(static_cast<char32_t>(v)) || is_number(static_cast<char32_t>(v))))
      return true;
  }
  return false;
}

char32_t simple_fold(char32_t c) {
  return static_cast<char32_t>(u_foldCase(static_cast<UChar32>(c), U_FOLD_CASE_DEFAULT));
}

}  // namespace diffuse::text
