// Qwen-Image's prompt encoding (QwenImagePipeline / QwenImageEditPipeline._get_qwen_prompt_embeds):
// the prompt inside the pipeline's chat template, tokenized by Qwen2's tokenizer (an edit's
// <|image_pad|> expanded to the source image's merged patches, the image through the Qwen2-VL
// image processor), run through Qwen2.5-VL, and the last hidden state kept without the
// template's system prefix (34 tokens for text-to-image, 64 for edits, as the pipelines drop).
#pragma once
#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>

#include "io/model_folder.h"
#include "models/qwen2_5_vl.h"
#include "pipeline/qwen_vl_image_processor.h"
#include "text/llama_tokenizer.h"

namespace diffuse::pipeline {

// A pipeline's chat template ("{}" marks the prompt) and how many of its leading tokens the
// pipeline drops from the embeddings (prompt_template_encode_start_idx).
struct QwenPromptTemplate {
  const char* text;
  int64_t drop;
};
// QwenImagePipeline's and QwenImageEditPipeline's (diffusers 0.35).
const QwenPromptTemplate& qwen_image_template();
const QwenPromptTemplate& qwen_image_edit_template();
// QwenImagePipeline's tokenizer_max_length: the prompt part is cut to this many tokens.
constexpr int64_t kQwenTokenizerMaxLength = 1024;

struct QwenPromptInputs {
  torch::Tensor input_ids;       // [1, L] int64
  torch::Tensor attention_mask;  // [1, L] int64, ones
  std::optional<QwenVLImageInput> image;
  bool truncated = false;  // t2i: the prompt lost tokens to the 1024-token limit
};

class QwenImageTextEncoder {
 public:
  // The tokenizer from `tokenizer/` (or the processor's copy in `processor/`), the image
  // processor from `processor/` when the folder has one, Qwen2.5-VL from `text_encoder/`.
  // IoError naming the component a folder lacks; the encoder loads when first needed.
  QwenImageTextEncoder(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype);

  // Text-to-image ids: template.format(prompt), truncated to 1024 + drop tokens.
  QwenPromptInputs tokenize(const std::string& prompt) const;
  // Edit ids: the edit template with <|image_pad|> repeated once per merged patch of `image`
  // (uint8 [H, W, 3], already resized by the pipeline), and the processed image. IoError when
  // the folder has no processor/ (preprocessor_config.json).
  QwenPromptInputs tokenize_edit(const std::string& prompt, const torch::Tensor& image) const;
  // The embeddings [1, L - drop, hidden] on the encoder's device in its dtype (the hidden state
  // after the final norm, the template's first `drop` tokens removed). InvalidArgument when an
  // image meets an encoder without a vision tower.
  torch::Tensor encode(const QwenPromptInputs& inputs, int64_t drop);
  // The last encoder run's output (for golden checks).
  const models::Qwen2_5_VLOutput& last_output() const { return last_; }

  bool has_processor() const { return processor_.has_value(); }
  models::Qwen2_5_VLForConditionalGeneration& model();
  void release() { model_ = nullptr; }

 private:
  io::ModelFolder folder_;
  torch::Device device_;
  torch::Dtype dtype_;
  std::shared_ptr<const text::LlamaTokenizer> tokenizer_;
  std::optional<QwenVLImageProcessorConfig> processor_;
  models::Qwen2_5_VLForConditionalGeneration model_{nullptr};
  models::Qwen2_5_VLOutput last_;
};

}  // namespace diffuse::pipeline
