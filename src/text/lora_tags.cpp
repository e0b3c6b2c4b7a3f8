#include "text/lora_tags.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "diffuse/errors.h"
#include "io/input_file.h"

namespace diffuse::text {

std::string extract_lora_tags(const std::string& prompt, std::vector<LoraTag>* tags) {
  static const std::string kOpen = "<lora:";
  std::string out;
  size_t pos = 0;
  for (size_t at; (at = prompt.find(kOpen, pos)) != std::string::npos;) {
    const size_t close = prompt.find('>', at);
    if (close == std::string::npos) break;  // unterminated: text, like any other
    out += prompt.substr(pos, at - pos);
    const std::string body = prompt.substr(at + kOpen.size(), close - at - kOpen.size());
    LoraTag tag;
    const size_t colon = body.rfind(':');
    tag.name = body.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string scale = body.substr(colon + 1);
      char* end = nullptr;
      tag.scale = std::strtod(scale.c_str(), &end);
      if (scale.empty() || *end != '\0' || !(std::fabs(tag.scale) <= kMaxLoraScale))
        throw InvalidArgument("prompt: <lora:" + body + ">: the scale '" + scale +
                              "' is not a number in [-100, 100]");
    }
    if (tag.name.empty()) throw InvalidArgument("prompt: <lora:" + body + ">: no adapter name");
    if (tags) tags->push_back(tag);
    pos = close + 1;
  }
  return out + prompt.substr(pos);
}

std::string resolve_lora_tag(const LoraTag& tag, const std::string& dir) {
  if (dir.empty())
    throw InvalidArgument("prompt: <lora:" + tag.name +
                          "> needs --lora-dir, the folder the adapter names refer to");
  const std::string suffix = ".safetensors";
  const bool has_suffix =
      tag.name.size() > suffix.size() &&
      tag.name.compare(tag.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string file = has_suffix ? tag.name : tag.name + suffix;
  try {
    io::require_inside_folder(file, "prompt", "<lora:" + tag.name + ">");
  } catch (const FormatError& e) {
    throw InvalidArgument(e.what());
  }
  const auto path = (std::filesystem::path(dir) / file).string();
  if (!std::filesystem::exists(path))
    throw IoError("prompt: <lora:" + tag.name + ">: no " + file + " in --lora-dir '" + dir + "'");
  return path;
}

}  // namespace diffuse::text
