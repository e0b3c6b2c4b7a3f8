// HiDream's four text encoders as its pipelines use them (diffusers HiDreamImagePipeline
// .encode_prompt): pooled = cat(CLIP-L text_embeds, CLIP-G text_embeds) from ids padded to
// min(max_sequence_length, 218) WITHOUT an attention mask; T5's last hidden state over all
// positions (mask given to T5); Llama-3.1's hidden states of every layer, stacked (mask given
// to Llama). The components are the model folder's text_encoder..text_encoder_4 with
// tokenizer..tokenizer_4.
#pragma once
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "io/model_folder.h"
#include "models/clip_text_model.h"
#include "models/llama.h"
#include "models/t5_encoder.h"
#include "pipeline/token_tensors.h"
#include "text/token_batch.h"
#include "text/tokenizer.h"

namespace diffuse::pipeline {

struct HiDreamEmbeddings {
  torch::Tensor pooled;  // [B, CLIP-L proj + CLIP-G proj]
  torch::Tensor t5;      // [B, L, T5 d_model]
  torch::Tensor llama;   // [layers, B, L, Llama hidden]
  // The ids each encoder was fed (for checks and for truncation warnings).
  text::TokenBatch clip_l_ids, clip_g_ids, t5_ids, llama_ids;

  // Batch concatenation (llama along its dim 1), e.g. [negative, positive] for guidance.
  static HiDreamEmbeddings cat(const std::vector<const HiDreamEmbeddings*>& parts);
  // The same embeddings on `device` (the transformer's, when the encoders run elsewhere).
  HiDreamEmbeddings to(const torch::Device& device) const;
};

class HiDreamTextEncoders {
 public:
  // Loads the four tokenizers and encoders from `folder`. IoError/ConfigError/FormatError
  // naming the component when one is missing or broken.
  HiDreamTextEncoders(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype);
  // Encoders and tokenizers built elsewhere (the demo trainer, whose encoders learn through
  // this same encode()).
  struct Parts {
    std::shared_ptr<const text::Tokenizer> clip_l_tok, clip_g_tok, t5_tok, llama_tok;
    models::ClipTextModel clip_l{nullptr}, clip_g{nullptr};
    models::T5EncoderModel t5{nullptr};
    models::LlamaForCausalLM llama{nullptr};
  };
  HiDreamTextEncoders(Parts parts, torch::Device device);

  HiDreamEmbeddings encode(const std::vector<std::string>& prompts,
                           int64_t max_sequence_length = 128);

 private:
  torch::Device device_;
  std::shared_ptr<const text::Tokenizer> clip_l_tok_, clip_g_tok_, t5_tok_, llama_tok_;
  models::ClipTextModel clip_l_{nullptr}, clip_g_{nullptr};
  models::T5EncoderModel t5_{nullptr};
  models::LlamaForCausalLM llama_{nullptr};
};

}  // namespace diffuse::pipeline
