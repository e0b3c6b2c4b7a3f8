// CLIP tokenizer files and prompt syntax: input = vocab.json NUL merges.txt NUL
// tokenizer_config.json NUL prompt; the folder is loaded, then the prompt is tokenized, parsed
// as an A1111 prompt and chunked.
#include <cstdint>
#include <string>

#include "diffuse/errors.h"
#include "fuzz_util.h"
#include "text/clip_tokenizer.h"
#include "text/prompt_weighting.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using diffuse::fuzz::split_at_nul;
  auto [vocab, rest] = split_at_nul(data, size);
  auto [merges, rest2] = split_at_nul(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  auto [config, prompt] =
      split_at_nul(reinterpret_cast<const uint8_t*>(rest2.data()), rest2.size());
  diffuse::fuzz::write_scratch("vocab.json", vocab);
  diffuse::fuzz::write_scratch("merges.txt", merges);
  diffuse::fuzz::write_scratch("tokenizer_config.json", config.empty() ? "{}" : config);
  try {
    const auto tok =
        diffuse::text::ClipTokenizer::from_folder(diffuse::fuzz::scratch_dir().string());
    tok.encode_padded({prompt});
    const auto parsed = diffuse::text::parse_prompt_attention(prompt);
    diffuse::text::chunk_prompt(tok, parsed);
  } catch (const diffuse::Error&) {
  }
  return 0;
}
