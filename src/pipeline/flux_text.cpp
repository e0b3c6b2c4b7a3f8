#include "pipeline/flux_text.h"

#include <torch/torch.h>

#include "diffuse/errors.h"

namespace diffuse::pipeline {
namespace {

constexpr int64_t kMaxT5Tokens = 512;

std::shared_ptr<const text::Tokenizer> flux_tokenizer(const io::ModelFolder& folder,
                                                      const std::string& name, const char* what) {
  if (!folder.has_component(name))
    throw IoError(folder.dir() + ": a FLUX model needs a '" + name + "' folder (" + what + ")");
  return text::shared_tokenizer(folder.component_dir(name));
}

}  // namespace

FluxEmbeddings FluxEmbeddings::to(const torch::Device& device) const {
  FluxEmbeddings e = *this;
  e.t5 = t5.to(device);
  e.pooled = pooled.to(device);
  return e;
}

FluxTextEncoders::FluxTextEncoders(const io::ModelFolder& folder, torch::Device device,
                                   torch::Dtype dtype)
    : device_(device) {
  clip_tok_ = flux_tokenizer(folder, "tokenizer", "the CLIP tokenizer");
  t5_tok_ = flux_tokenizer(folder, "tokenizer_2", "the T5 tokenizer");
  clip_ = models::load_clip_text_model(folder, device, dtype, "text_encoder");
  t5_ = models::load_t5_encoder(folder, "text_encoder_2", device,
                                dtype == torch::kFloat16 ? torch::kFloat32 : dtype);
}

FluxEmbeddings FluxTextEncoders::encode(const std::vector<std::string>& prompts,
                                        int64_t max_sequence_length) {
  if (max_sequence_length < 1 || max_sequence_length > kMaxT5Tokens)
    throw InvalidArgument("max_sequence_length must be in 1.." + std::to_string(kMaxT5Tokens) +
                          " (T5 tokens), got " + std::to_string(max_sequence_length));
  FluxEmbeddings e;
  e.clip_ids = clip_tok_->encode_padded(prompts, clip_tok_->model_max_length());
  e.t5_ids = t5_tok_->encode_padded(prompts, max_sequence_length);
  e.pooled = clip_->forward(token_ids_tensor(e.clip_ids).to(device_)).pooler_output;
  e.t5 = t5_->forward(token_ids_tensor(e.t5_ids).to(device_)).last_hidden_state;
  return e;
}

}  // namespace diffuse::pipeline
