#include "text/pretokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <new>

#include "diffuse/errors.h"

namespace diffuse::text {

struct PretokenizerRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() {
    if (code) pcre2_code_free(code);
  }
};

PretokenizerRegex::PretokenizerRegex(const std::string& pattern, const std::string& where)
    : code_(std::make_unique<Code>()) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw ConfigError(where + ": regex rejected by PCRE2 at offset " + std::to_string(offset) +
                      ": " + reinterpret_cast<const char*>(msg));
  }
  // Optional: without a JIT for this CPU PCRE2 falls back to its interpreter.
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);
}

PretokenizerRegex::~PretokenizerRegex() = default;

void PretokenizerRegex::split(std::string_view text,
                              const std::function<void(std::string_view)>& piece) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (!md) throw std::bad_alloc();
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> guard(md, pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t emitted = 0;  // text before this is handed out
  size_t pos = 0;      // where the next search starts
  while (pos < text.size()) {
    const int rc =
        pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw InvalidArgument("pre-tokenizer regex: match failed (PCRE2 error " + std::to_string(rc) +
                            ")");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > emitted) piece(text.substr(emitted, ov[0] - emitted));
    if (ov[1] > ov[0]) {
      piece(text.substr(ov[0], ov[1] - ov[0]));
      emitted = pos = ov[1];
      continue;
    }
    // An empty match yields no piece (as in tokenizers) but still splits the text around it;
    // the search steps one code point on.
    emitted = ov[0];
    pos = ov[0] + 1;
    while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
  }
  if (emitted < text.size()) piece(text.substr(emitted));
}

}  // namespace diffuse::text
