#include "pipeline/qwenimage_text.h"

#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "text/tokenizer.h"

namespace diffuse::pipeline {
namespace {

constexpr const char* kImagePad = "<|image_pad|>";

std::string format_template(const char* text, const std::string& prompt) {
  std::string s = text;
  const auto at = s.find("{}");
  return s.substr(0, at) + prompt + s.substr(at + 2);
}

torch::Tensor ids_tensor(const std::vector<int64_t>& ids) {
  return torch::tensor(ids, torch::kInt64).view({1, -1});
}

}  // namespace

const QwenPromptTemplate& qwen_image_template() {
  static const QwenPromptTemplate t{
      "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
      "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
      "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
      34};
  return t;
}

const QwenPromptTemplate& qwen_image_edit_template() {
  static const QwenPromptTemplate t{
      "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
      "texture, objects, background), then explain how the user's text instruction should alter "
      "or modify the image. Generate a new image that meets the user's requirements while "
      "maintaining consistency with the original input where appropriate.<|im_end|>\n"
      "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n"
      "<|im_start|>assistant\n",
      64};
  return t;
}

QwenImageTextEncoder::QwenImageTextEncoder(const io::ModelFolder& folder, torch::Device device,
                                           torch::Dtype dtype)
    : folder_(folder), device_(device), dtype_(dtype) {
  namespace fs = std::filesystem;
  if (!folder.has_component("text_encoder"))
    throw IoError("Qwen-Image folder '" + folder.dir() +
                  "' has no text_encoder/ (Qwen2.5-VL encodes the prompts)");
  std::string tok_dir;
  for (const char* c : {"tokenizer", "processor"})
    if (folder.has_component(c) && fs::exists(fs::path(folder.component_dir(c)) / "vocab.json")) {
      tok_dir = folder.component_dir(c);
      break;
    }
  if (tok_dir.empty())
    throw IoError("Qwen-Image folder '" + folder.dir() +
                  "' has no tokenizer/ (or processor/) with vocab.json and merges.txt");
  tokenizer_ = text::shared_qwen2_tokenizer(tok_dir);
  if (folder.has_component("processor") &&
      fs::exists(fs::path(folder.component_dir("processor")) / "preprocessor_config.json"))
    processor_ = QwenVLImageProcessorConfig::from_folder(folder.component_dir("processor"));
}

models::Qwen2_5_VLForConditionalGeneration& QwenImageTextEncoder::model() {
  if (!model_) model_ = models::load_qwen2_5_vl(folder_, "text_encoder", device_, dtype_);
  return model_;
}

QwenPromptInputs QwenImageTextEncoder::tokenize(const std::string& prompt) const {
  const auto& t = qwen_image_template();
  auto ids = tokenizer_->encode_ordinary(format_template(t.text, prompt));
  QwenPromptInputs out;
  const auto limit = static_cast<size_t>(kQwenTokenizerMaxLength + t.drop);
  if (ids.size() > limit) {
    ids.resize(limit);
    out.truncated = true;
  }
  out.input_ids = ids_tensor(ids);
  out.attention_mask = torch::ones_like(out.input_ids);
  return out;
}

QwenPromptInputs QwenImageTextEncoder::tokenize_edit(const std::string& prompt,
                                                     const torch::Tensor& image) const {
  if (!processor_)
    throw IoError("Qwen-Image folder '" + folder_.dir() +
                  "' has no processor/preprocessor_config.json: an edit shows the source image "
                  "to Qwen2.5-VL through the Qwen2-VL image processor");
  QwenPromptInputs out;
  out.image = qwen_vl_preprocess(image, *processor_);
  // Qwen2VLProcessor: each <|image_pad|> becomes one token per merged 2x2 patch.
  std::string text = format_template(qwen_image_edit_template().text, prompt);
  const auto at = text.find(kImagePad);
  std::string pads;
  for (int64_t i = 0; i < out.image->merged_tokens(processor_->merge_size); ++i) pads += kImagePad;
  text = text.substr(0, at) + pads + text.substr(at + std::string(kImagePad).size());
  out.input_ids = ids_tensor(tokenizer_->encode_ordinary(text));
  out.attention_mask = torch::ones_like(out.input_ids);
  return out;
}

torch::Tensor QwenImageTextEncoder::encode(const QwenPromptInputs& inputs, int64_t drop) {
  auto& m = model();
  torch::Tensor pixels;
  std::array<int64_t, 3> grid{};
  if (inputs.image) {
    pixels = inputs.image->pixel_values;
    grid = inputs.image->grid_thw;
  }
  last_ = m->forward(inputs.input_ids, inputs.attention_mask, pixels, grid);
  const int64_t L = last_.last_hidden_state.size(1);
  if (L <= drop)
    throw InvalidArgument("Qwen-Image: the prompt template has only " + std::to_string(L) +
                          " tokens, fewer than the " + std::to_string(drop) +
                          " the pipeline drops");
  // Every row is attended (one prompt, no padding): drop the template's prefix.
  return last_.last_hidden_state.narrow(1, drop, L - drop);
}

}  // namespace diffuse::pipeline
