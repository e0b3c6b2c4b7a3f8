// Golden runner for the tokenizers (CLIP, T5, Llama-3; the folder is chosen by
// text_components.h): raw ids per prompt, and the padded/truncated batch the pipelines feed
// the text encoder.
#include <torch/torch.h>

#include "diffuse/errors.h"
#include "text/tokenizer.h"
#include "verify/runners.h"
#include "verify/text_components.h"

namespace diffuse::verify {
namespace {

torch::Tensor to_tensor(const std::vector<int64_t>& v) {
  return torch::tensor(c10::ArrayRef<int64_t>(v), torch::kInt64);
}

torch::Tensor to_tensor(const std::vector<std::vector<int64_t>>& rows, int64_t width) {
  auto out = torch::zeros({static_cast<int64_t>(rows.size()), width}, torch::kInt64);
  for (size_t i = 0; i < rows.size(); ++i) out[static_cast<int64_t>(i)] = to_tensor(rows[i]);
  return out;
}

// Prompts as UTF-8 bytes (prompt_utf8.0, .1, ...), or params.prompts when a set has no bytes.
std::vector<std::string> case_prompts(const GoldenCase& c, const CaseTensors& tensors) {
  std::vector<std::string> prompts;
  for (int i = 0; tensors.has("prompt_utf8." + std::to_string(i)); ++i) {
    auto bytes = tensors.get("prompt_utf8." + std::to_string(i)).contiguous();
    const auto* p = bytes.data_ptr<uint8_t>();
    prompts.emplace_back(reinterpret_cast<const char*>(p), static_cast<size_t>(bytes.numel()));
  }
  if (prompts.empty()) prompts = c.param_strings("prompts");
  if (prompts.empty()) throw FormatError(c.file + ": tokenizer case has no prompts");
  return prompts;
}

void compare_id(CaseResult& result, const GoldenCase& c, const char* key, int64_t got) {
  if (!c.params.contains(key)) return;
  result.add(key, compare_exact(key, torch::tensor(got), torch::tensor(c.param(key, int64_t{0}))));
}

}  // namespace

CaseResult verify_tokenizer(const GoldenSet& set, const GoldenCase& c, const VerifyOptions&) {
  const auto tok_ptr = text::load_tokenizer(tokenizer_dir_for(set, c));
  const text::Tokenizer& tok = *tok_ptr;
  CaseTensors tensors(c);
  const auto prompts = case_prompts(c, tensors);
  CaseResult result;
  compare_id(result, c, "bos_token_id", tok.bos_id());
  compare_id(result, c, "eos_token_id", tok.eos_id());
  compare_id(result, c, "pad_token_id", tok.pad_id());

  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string name = "raw_ids." + std::to_string(i);
    if (tensors.has(name))
      result.add(name, compare_exact(name, to_tensor(tok.encode(prompts[i])), tensors.get(name)));
  }
  const int64_t max_length = c.param("max_length", tok.model_max_length());
  const auto batch = tok.encode_padded(prompts, max_length);
  if (tensors.has("input_ids"))
    result.add("input_ids", compare_exact("input_ids", to_tensor(batch.input_ids, max_length),
                                          tensors.get("input_ids")));
  if (tensors.has("attention_mask"))
    result.add("attention_mask",
               compare_exact("attention_mask", to_tensor(batch.attention_mask, max_length),
                             tensors.get("attention_mask")));
  return result;
}

}  // namespace diffuse::verify
