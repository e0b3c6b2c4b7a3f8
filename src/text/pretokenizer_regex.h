// A Hugging Face Split pre-tokenizer (behavior Isolated, invert false) driven by a regex
// compiled by PCRE2 in UTF + UCP mode (\p{L}, \p{N}, \s as Unicode White_Space, case-insensitive
// groups with Unicode case folding). Shared by the Llama tokenizer, which reads the pattern
// from tokenizer.json, and the Llama BPE trainer, which must split text the same way.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace diffuse::text {

class PretokenizerRegex {
 public:
  // ConfigError "<where>: regex rejected by PCRE2 at offset N: <why>" for a bad pattern.
  PretokenizerRegex(const std::string& pattern, const std::string& where);
  ~PretokenizerRegex();
  PretokenizerRegex(const PretokenizerRegex&) = delete;
  PretokenizerRegex& operator=(const PretokenizerRegex&) = delete;

  // Calls `piece` with each non-empty piece of `text` in order: every match, and the text
  // between matches as a piece of its own. `text` must be valid UTF-8 (callers decode it
  // first). InvalidArgument if PCRE2 fails while matching (e.g. its match limit).
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace diffuse::text
