// FLUX's two text encoders as FluxPipeline._encode_prompt uses them: CLIP-L's pooled output
// only (ids padded to the tokenizer's 77, no attention mask) and T5's last hidden state over
// max_sequence_length ids, padding included and NOT masked. The components are the folder's
// text_encoder + tokenizer (CLIP) and text_encoder_2 + tokenizer_2 (T5).
#pragma once
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "io/model_folder.h"
#include "models/clip_text_model.h"
#include "models/t5_encoder.h"
#include "pipeline/token_tensors.h"
#include "text/token_batch.h"
#include "text/tokenizer.h"

namespace diffuse::pipeline {

struct FluxEmbeddings {
  torch::Tensor t5;                   // [B, L, T5 d_model]: the transformer's encoder_hidden_states
  torch::Tensor pooled;               // [B, CLIP hidden]: its pooled_projections
  text::TokenBatch clip_ids, t5_ids;  // what the encoders were fed

  FluxEmbeddings to(const torch::Device& device) const;
};

class FluxTextEncoders {
 public:
  // Loads both tokenizers and encoders; IoError/ConfigError/FormatError naming the component
  // when one is missing or broken. T5 runs in float32 when `dtype` is float16 (T5-XXL's
  // activations overflow it).
  FluxTextEncoders(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype);

  // InvalidArgument unless 1 <= max_sequence_length <= 512 (FluxPipeline's limit). The
  // `truncated` flags of the id batches say which prompts lost tokens.
  FluxEmbeddings encode(const std::vector<std::string>& prompts, int64_t max_sequence_length);

  // CLIP-L, which LoRA files address as the text encoder (lora_te1_*, text_encoder.*).
  models::ClipTextModel& clip() { return clip_; }

 private:
  torch::Device device_;
  std::shared_ptr<const text::Tokenizer> clip_tok_, t5_tok_;
  models::ClipTextModel clip_{nullptr};
  models::T5EncoderModel t5_{nullptr};
};

}  // namespace diffuse::pipeline
