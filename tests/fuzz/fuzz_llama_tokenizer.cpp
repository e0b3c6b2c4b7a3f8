// Llama-3 tokenizer files: input = tokenizer.json NUL tokenizer_config.json NUL text.
#include <cstdint>
#include <string>

#include "diffuse/errors.h"
#include "fuzz_util.h"
#include "text/llama_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using diffuse::fuzz::split_at_nul;
  auto [json, rest] = split_at_nul(data, size);
  auto [config, text] = split_at_nul(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  diffuse::fuzz::write_scratch("tokenizer.json", json);
  diffuse::fuzz::write_scratch("tokenizer_config.json", config.empty() ? "{}" : config);
  try {
    const auto tok =
        diffuse::text::LlamaTokenizer::from_folder(diffuse::fuzz::scratch_dir().string());
    tok.encode(text);
  } catch (const diffuse::Error&) {
  }
  return 0;
}
