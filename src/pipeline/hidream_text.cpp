#include "pipeline/hidream_text.h"

#include <torch/torch.h>

#include <algorithm>

#include "device/memory.h"
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
                                         torch::Dtype dtype, bool one_at_a_time)
    : device_(device), dtype_(dtype), one_at_a_time_(one_at_a_time) {
  clip_l_tok_ = tokenizer(folder, "tokenizer");
  clip_g_tok_ = tokenizer(folder, "tokenizer_2");
  t5_tok_ = tokenizer(folder, "tokenizer_3");
  llama_tok_ = tokenizer(folder, "tokenizer_4");
  for (const char* component :
       {"text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4"})
    if (!folder.has_component(component))
      throw IoError(folder.dir() + ": a HiDream model needs a '" + component + "' folder");
  folder_ = std::make_unique<io::ModelFolder>(folder);
  if (!one_at_a_time_)
    for (int i = 0; i < 4; ++i) load(i);
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

HiDreamTextEncoders::~HiDreamTextEncoders() = default;

void HiDreamTextEncoders::load(int i) {
  const auto& f = *folder_;
  switch (i) {
    case 0:
      if (!clip_l_) clip_l_ = models::load_clip_text_model(f, device_, dtype_, "text_encoder");
      break;
    case 1:
      if (!clip_g_) clip_g_ = models::load_clip_text_model(f, device_, dtype_, "text_encoder_2");
      break;
    case 2:
      // T5-XXL overflows in float16 (activations beyond 65504); bf16 and float32 are safe.
      if (!t5_)
        t5_ = models::load_t5_encoder(f, "text_encoder_3", device_,
                                      dtype_ == torch::kFloat16 ? torch::kFloat32 : dtype_);
      break;
    default:
      if (!llama_) llama_ = models::load_llama(f, "text_encoder_4", device_, dtype_);
  }
}

void HiDreamTextEncoders::release(int i) {
  if (!one_at_a_time_ || !folder_) return;
  switch (i) {
    case 0:
      clip_l_ = nullptr;
      break;
    case 1:
      clip_g_ = nullptr;
      break;
    case 2:
      t5_ = nullptr;
      break;
    default:
      llama_ = nullptr;
  }
  device::empty_cache(device_);  // the next encoder loads into memory given back, not beside it
}

HiDreamEmbeddings HiDreamTextEncoders::encode(const std::vector<std::string>& prompts,
                                              int64_t max_sequence_length) {
  return run(prompts, max_sequence_length, /*each=*/false).front();
}

std::vector<HiDreamEmbeddings> HiDreamTextEncoders::encode_each(
    const std::vector<std::string>& prompts, int64_t max_sequence_length) {
  return run(prompts, max_sequence_length, /*each=*/true);
}

std::vector<HiDreamEmbeddings> HiDreamTextEncoders::run(const std::vector<std::string>& prompts,
                                                        int64_t max_sequence_length, bool each) {
  if (max_sequence_length < 1)
    throw InvalidArgument("max_sequence_length must be >= 1, got " +
                          std::to_string(max_sequence_length));
  // One batch of all prompts, or one batch per prompt (each prompt's numbers then do not
  // depend on what else is encoded with it).
  std::vector<std::vector<std::string>> batches;
  if (each)
    for (const auto& p : prompts) batches.push_back({p});
  else
    batches.push_back(prompts);
  std::vector<HiDreamEmbeddings> out(batches.size());
  const int64_t clip_len = std::min(max_sequence_length, kClipMaxLength);
  for (size_t b = 0; b < batches.size(); ++b) {
    auto& e = out[b];
    e.clip_l_ids = clip_l_tok_->encode_padded(batches[b], clip_len);
    e.clip_g_ids = clip_g_tok_->encode_padded(batches[b], clip_len);
    e.t5_ids = t5_tok_->encode_padded(batches[b],
                                      std::min(max_sequence_length, t5_tok_->model_max_length()));
    e.llama_ids = llama_tok_->encode_padded(batches[b], max_sequence_length);
  }
  // Encoder by encoder over every batch, so that one at a time each loads once.
  std::vector<torch::Tensor> pooled_l(out.size());
  if (folder_) load(0);
  for (size_t b = 0; b < out.size(); ++b)
    pooled_l[b] = clip_l_->forward(token_ids_tensor(out[b].clip_l_ids).to(device_)).text_embeds;
  release(0);
  if (folder_) load(1);
  for (size_t b = 0; b < out.size(); ++b)
    out[b].pooled =
        torch::cat({pooled_l[b],
                    clip_g_->forward(token_ids_tensor(out[b].clip_g_ids).to(device_)).text_embeds},
                   -1);
  release(1);
  if (folder_) load(2);
  for (auto& e : out)
    e.t5 = t5_->forward(token_ids_tensor(e.t5_ids).to(device_),
                        token_mask_tensor(e.t5_ids).to(device_))
               .last_hidden_state;
  release(2);
  if (folder_) load(3);
  for (auto& e : out)
    e.llama = llama_
                  ->forward(token_ids_tensor(e.llama_ids).to(device_),
                            token_mask_tensor(e.llama_ids).to(device_))
                  .stacked();
  release(3);
  return out;
}

}  // namespace diffuse::pipeline
