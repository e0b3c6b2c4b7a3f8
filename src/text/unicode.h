// The few Unicode services the tokenizers need, backed by ICU (libicu): UTF-8 conversion,
// general categories, NFC and full lower-casing. Text is handled as std::u32string (one code
// point per element) so the tokenizer can mirror Python's per-character string logic.
#pragma once
#include <string>

namespace diffuse::text {

// Decodes UTF-8; InvalidArgument naming the byte offset for malformed input (overlong forms,
// surrogates, truncated sequences, values above U+10FFFF).
std::u32string utf8_decode(const std::string& bytes);
std::string utf8_encode(const std::u32string& text);
std::string utf8_encode(char32_t c);

// Unicode normalisation form C (Python: unicodedata.normalize("NFC", s)).
std::u32string nfc(const std::u32string& text);
// Full lower-case mapping with the root locale, including the Final_Sigma rule and one-to-many
// mappings such as U+0130 -> "i\u0307" (Python: str.lower()).
std::u32string to_lower(const std::u32string& text);

// General category tests.
bool is_letter(char32_t c);           // L*  (regex \p{L})
bool is_number(char32_t c);           // N*  (regex \p{N})
bool is_other(char32_t c);            // C*  (Cc, Cf, Cs, Co and unassigned Cn)
bool is_space_separator(char32_t c);  // Zs
bool is_white_space(char32_t c);      // White_Space property (regex \s)
bool is_python_space(char32_t c);     // Python str.isspace() (what str.split() splits on)
// True if a simple case variant of `c` other than `c` itself (upper, lower, title, folded) is a
// letter or a number, e.g. for U+0345 COMBINING GREEK YPOGEGRAMMENI (upper case U+0399).
// Case-insensitive regex classes treat such characters as members of \p{L} / \p{N}.
bool has_letter_or_number_case_variant(char32_t c);
// Simple case folding (one code point), as case-insensitive regex literals compare.
char32_t simple_fold(char32_t c);

}  // namespace diffuse::text
