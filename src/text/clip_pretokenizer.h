// Text clean-up and word splitting of transformers' slow CLIPTokenizer, as it runs when the
// optional `ftfy` package is absent (the default `pip install transformers` environment that
// the reference pipelines use).
#pragma once
#include <string>
#include <vector>

namespace diffuse::text {

// transformers BasicTokenizer(do_lower_case=True, strip_accents=False, do_split_on_punc=False)
// .tokenize(text), joined by single spaces: drops NUL, U+FFFD and control/format/unassigned
// characters (category C*, except \t \n \r), maps whitespace to spaces, puts spaces around CJK
// ideographs, applies NFC, splits on whitespace and lower-cases each word.
std::u32string clip_basic_clean(const std::u32string& text);

// CLIP's pre-tokenisation regex, applied to cleaned text with re.IGNORECASE:
//   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// Returns the matches in order (what Python's regex.findall returns).
std::vector<std::u32string> clip_split_words(const std::u32string& text);

}  // namespace diffuse::text
