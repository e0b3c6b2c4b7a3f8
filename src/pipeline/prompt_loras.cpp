#include "pipeline/prompt_loras.h"

#include <map>

#include "text/lora_tags.h"

namespace diffuse::pipeline {

std::vector<LoraSpec> take_prompt_loras(GenerationConfig& config, const std::string& lora_dir) {
  std::vector<text::LoraTag> tags;
  for (auto* list : {&config.prompts, &config.negative_prompts})
    for (auto& p : *list) p = text::extract_lora_tags(p, &tags);
  std::map<std::string, double> seen;
  std::vector<LoraSpec> specs;
  for (const auto& t : tags) {
    auto [it, fresh] = seen.emplace(t.name, t.scale);
    if (!fresh && it->second != t.scale)
      throw InvalidArgument("prompt: <lora:" + t.name + "> is given twice with different scales");
    if (fresh) specs.push_back({text::resolve_lora_tag(t, lora_dir), t.scale});
  }
  return specs;
}

}  // namespace diffuse::pipeline
