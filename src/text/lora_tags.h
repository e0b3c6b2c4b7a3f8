// AUTOMATIC1111's in-prompt LoRA references: "<lora:NAME>" or "<lora:NAME:SCALE>", taken out
// of the prompt text (they are not words for the text encoder) and resolved against a folder.
#pragma once
#include <string>
#include <vector>

namespace diffuse::text {

// Beyond this a LoRA scale is a typo, not a wish: the weights' update would overflow half
// precision (and soon float32) and the run end in NaN.
constexpr double kMaxLoraScale = 100.0;

struct LoraTag {
  std::string name;
  double scale = 1.0;
};

// The prompt without its <lora:...> tags, and the tags in order. InvalidArgument for a tag
// whose name is empty or whose scale is not a number in [-kMaxLoraScale, kMaxLoraScale].
std::string extract_lora_tags(const std::string& prompt, std::vector<LoraTag>* tags);

// DIR/NAME.safetensors (or DIR/NAME when NAME already ends in .safetensors); IoError naming
// the tag and the folder when it does not exist, InvalidArgument when `dir` is empty or NAME
// leaves the folder.
std::string resolve_lora_tag(const LoraTag& tag, const std::string& dir);

}  // namespace diffuse::text
