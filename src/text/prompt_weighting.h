// AUTOMATIC1111's prompt syntax for CLIP text encoders: attention weights and long prompts.
//   (text) x1.1, ((text)) x1.21, (text:1.5) x1.5, [text] /1.1, \( \) \[ \] literal brackets,
//   BREAK starts a new 75-token chunk; unbalanced brackets are text, as in A1111.
// A prompt becomes chunks of 75 tokens, each encoded as BOS + 75 + EOS (padded), and the
// weights scale the text encoder's output per token, after which the mean is restored
// (A1111's "Original" emphasis). A prompt without syntax and within 75 tokens gives the same
// ids as the plain tokenizer, and all weights 1.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::text {

class ClipTokenizer;

struct WeightedText {
  std::string text;
  double weight = 1.0;
  bool is_break = false;  // BREAK: the text is empty
};

// A1111's parse_prompt_attention, with two differences: weights may have exponents, and a
// weight beyond [-kMaxPromptWeight, kMaxPromptWeight] (written, or from deep nesting) is
// clamped with a warning (A1111 takes anything, and 1e3 wrecks the image).
constexpr double kMaxPromptWeight = 10.0;
std::vector<WeightedText> parse_prompt_attention(const std::string& prompt,
                                                 std::vector<std::string>* warnings = nullptr);

// The prompt's text with the syntax taken out (brackets, weights, escapes; BREAKs dropped):
// what a prompt whose weights all come out 1 means, e.g. "a (fox:1.0)" -> "a fox".
std::string plain_text(const std::vector<WeightedText>& parsed);

// One chunk: model_max_length ids (BOS, up to 75 tokens, EOS, padding) and a weight per id.
struct PromptChunk {
  std::vector<int64_t> ids;
  std::vector<float> weights;
  bool all_weights_one() const;
};

// The most chunks a prompt may make (BREAKs and length together): 64 x 75 = 4800 tokens. Each
// chunk is a text-encoder pass and 77 more tokens every cross-attention layer attends to at
// every step; 20,000 BREAKs in a pasted prompt took 2.8 GiB before this bound.
constexpr size_t kMaxPromptChunks = 64;

// The chunks of a parsed prompt (at least one). A chunk that would end within 20 tokens after
// a comma is cut after the comma instead, as A1111 does (comma_padding_backtrack 20).
// InvalidArgument beyond kMaxPromptChunks, before the chunk past the bound is built.
std::vector<PromptChunk> chunk_prompt(const ClipTokenizer& tokenizer,
                                      const std::vector<WeightedText>& parsed);

}  // namespace diffuse::text
