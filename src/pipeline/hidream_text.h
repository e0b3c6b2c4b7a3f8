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
  // naming the component when one is missing or broken. `one_at_a_time` (the memory plan's
  // choice when the four do not fit together: Llama-3.1-8B and T5-XXL are 25 GB in bf16): each
  // encoder is loaded when its turn comes, runs over every prompt, and is freed before the next.
  HiDreamTextEncoders(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype,
                      bool one_at_a_time = false);
  // Encoders and tokenizers built elsewhere (the demo trainer, whose encoders learn through
  // this same encode()).
  struct Parts {
    std::shared_ptr<const text::Tokenizer> clip_l_tok, clip_g_tok, t5_tok, llama_tok;
    models::ClipTextModel clip_l{nullptr}, clip_g{nullptr};
    models::T5EncoderModel t5{nullptr};
    models::LlamaForCausalLM llama{nullptr};
  };
  HiDreamTextEncoders(Parts parts, torch::Device device);
  ~HiDreamTextEncoders();

  // All prompts as one batch.
  HiDreamEmbeddings encode(const std::vector<std::string>& prompts,
                           int64_t max_sequence_length = 128);
  // Each prompt on its own (a batch of one, as the pipelines encode them), every encoder over
  // all prompts before the next encoder runs.
  std::vector<HiDreamEmbeddings> encode_each(const std::vector<std::string>& prompts,
                                             int64_t max_sequence_length);
  bool one_at_a_time() const { return one_at_a_time_; }

 private:
  std::vector<HiDreamEmbeddings> run(const std::vector<std::string>& prompts,
                                     int64_t max_sequence_length, bool each);
  void load(int encoder);     // 0 CLIP-L, 1 CLIP-G, 2 T5, 3 Llama: from folder_, if not loaded
  void release(int encoder);  // one at a time: frees it again
  torch::Device device_;
  torch::Dtype dtype_ = torch::kFloat32;
  bool one_at_a_time_ = false;
  std::unique_ptr<io::ModelFolder> folder_;  // null for encoders given as Parts
  std::shared_ptr<const text::Tokenizer> clip_l_tok_, clip_g_tok_, t5_tok_, llama_tok_;
  models::ClipTextModel clip_l_{nullptr}, clip_g_{nullptr};
  models::T5EncoderModel t5_{nullptr};
  models::LlamaForCausalLM llama_{nullptr};
};

}  // namespace diffuse::pipeline
