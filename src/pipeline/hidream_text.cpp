#include "pipeline/hidream_text.h"

#include <torch/torch.h>

#include <algorithm>

#include "diffuse/errors.h"

namespace diffuse::pipeline {
namespace {

// CLIP in HiDream runs on Long-CLIP-length ids (position embeddings of 248).
constexpr int64_t kClipMaxLength = 218;

std::shared_ptr<const text::Tokenizer> tokenizer(const io::ModelFolder& folder,
                                                 const std::string& name) {
  if (!folder.has_component(name))
    throw IoError(folder.dir() + ": a HiDream model needs a '" + name + "' folder");
  return text::shared_tokenizer(folder.component_dir(name));
}

text::TokenBatch concat(const std::vector<const text::TokenBatch*>& parts) {
  text::TokenBatch out;
  for (const auto* p : parts) {
    out.input_ids.insert(out.input_ids.end(), p->input_ids.begin(), p->input_ids.end());
    out.attention_mask.insert(out.attention_mask.end(), p->attention_mask.begin(),
                              p->attention_mask.end());
    out.truncated.insert(out.truncated.end(), p->truncated.begin(), p->truncated.end());
  }
  return out;
}

}  // namespace

HiDreamEmbeddings HiDreamEmbeddings::to(const torch::Device& device) const {
  HiDreamEmbeddings e = *this;
  for (auto* t : {&e.pooled, &e.t5, &e.llama})
    if (t->defined()) *t = t->to(device);
  return e;
}

HiDreamEmbeddings HiDreamEmbeddings::cat(const std::vector<const HiDreamEmbeddings*>& parts) {
  std::vector<torch::Tensor> pooled, t5, llama;
  std::vector<const text::TokenBatch*> l, g, t, m;
  for (const auto* p : parts) {
    pooled.push_back(p->pooled);
    t5.push_back(p->t5);
    llama.push_back(p->llama);
    l.push_back(&p->clip_l_ids);
    g.push_back(&p->clip_g_ids);
    t.push_back(&p->t5_ids);
    m.push_back(&p->llama_ids);
  }
  return {torch::cat(pooled, 0),
          torch::cat(t5, 0),
          torch::cat(llama, 1),
          concat(l),
          concat(g),
          concat(t),
          concat(m)};
}

HiDreamTextEncoders::HiDreamTextEncoders(const io::ModelFolder& folder, torch::Device device,
                                         torch::Dtype dtype)
    : device_(device) {
  clip_l_tok_ = tokenizer(folder, "tokenizer");
  clip_g_tok_ = tokenizer(folder, "tokenizer_2");
  t5_tok_ = tokenizer(folder, "tokenizer_3");
  llama_tok_ = tokenizer(folder, "tokenizer_4");
  clip_l_ = models::load_clip_text_model(folder, device, dtype, "text_encoder");
  clip_g_ = models::load_clip_text_model(folder, device, dtype, "text_encoder_2");
  // T5-XXL overflows in float16 (activations beyond 65504); bf16 and float32 are safe.
  t5_ = models::load_t5_encoder(folder, "text_encoder_3", device,
                                dtype == torch::kFloat16 ? torch::kFloat32 : dtype);
  llama_ = models::load_llama(folder, "text_encoder_4", device, dtype);
}

HiDreamTextEncoders::HiDreamTextEncoders(Parts parts, torch::Device device)
    : device_(device),
      clip_l_tok_(std::move(parts.clip_l_tok)),
      clip_g_tok_(std::move(parts.clip_g_tok)),
      t5_tok_(std::move(parts.t5_tok)),
      llama_tok_(std::move(parts.llama_tok)),
      clip_l_(parts.clip_l),
      clip_g_(parts.clip_g),
      t5_(parts.t5),
      llama_(parts.llama) {}

HiDreamEmbeddings HiDreamTextEncoders::encode(const std::vector<std::string>& prompts,
                                              int64_t max_sequence_length) {
  if (max_sequence_length < 1)
    throw InvalidArgument("max_sequence_length must be >= 1, got " +
                          std::to_string(max_sequence_length));
  HiDreamEmbeddings e;
  const int64_t clip_len = std::min(max_sequence_length, kClipMaxLength);
  e.clip_l_ids = clip_l_tok_->encode_padded(prompts, clip_len);
  e.clip_g_ids = clip_g_tok_->encode_padded(prompts, clip_len);
  e.t5_ids =
      t5_tok_->encode_padded(prompts, std::min(max_sequence_length, t5_tok_->model_max_length()));
  e.llama_ids = llama_tok_->encode_padded(prompts, max_sequence_length);

  auto pooled_l = clip_l_->forward(token_ids_tensor(e.clip_l_ids).to(device_)).text_embeds;
  auto pooled_g = clip_g_->forward(token_ids_tensor(e.clip_g_ids).to(device_)).text_embeds;
  e.pooled = torch::cat({pooled_l, pooled_g}, -1);
  e.t5 =
      t5_->forward(token_ids_tensor(e.t5_ids).to(device_), token_mask_tensor(e.t5_ids).to(device_))
          .last_hidden_state;
  e.llama = llama_
                ->forward(token_ids_tensor(e.llama_ids).to(device_),
                          token_mask_tensor(e.llama_ids).to(device_))
                .stacked();
  return e;
}

}  // namespace diffuse::pipeline
