#include "verify/text_components.h"

#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;

namespace diffuse::verify {
namespace {

// Components of the model folder whose name starts with `prefix`, in model_index.json order
// (nlohmann keeps keys sorted: tokenizer, tokenizer_2, ...); `prefix` alone if there is none.
std::vector<std::string> components_with_prefix(const GoldenSet& set, const std::string& prefix) {
  std::vector<std::string> out;
  const fs::path index = fs::path(set.model_dir()) / "model_index.json";
  if (fs::exists(index)) {
    const auto j = io::JsonConfig::load(index.string()).json();
    for (const auto& [key, value] : j.items())
      if (key.rfind(prefix, 0) == 0 && value.is_array() && !value.empty() && !value[0].is_null())
        out.push_back(key);
  }
  if (out.empty()) out.push_back(prefix);
  return out;
}

// The folder a params path ("model/tokenizer_4") names, relative to the set.
std::string param_dir(const GoldenSet& set, const GoldenCase& c, const char* key) {
  if (!c.params.contains(key)) return "";
  const std::string dir =
      set.path_inside(c.param(key, std::string()), std::string("params.") + key);
  return fs::path(dir).lexically_normal().string();
}

bool id_agrees(const GoldenCase& c, const char* key, int64_t id) {
  return !c.params.contains(key) || c.param(key, int64_t{0}) == id;
}

bool tokenizer_agrees(const GoldenCase& c, const text::Tokenizer& tok) {
  return id_agrees(c, "pad_token_id", tok.pad_id()) && id_agrees(c, "eos_token_id", tok.eos_id()) &&
         id_agrees(c, "bos_token_id", tok.bos_id());
}

// The last dimension of the case's first floating output (the encoder's width), or -1.
int64_t output_width(const GoldenCase& c) {
  if (!c.raw.contains("outputs") || !c.raw["outputs"].is_object()) return -1;
  for (const char* name : {"last_hidden_state", "prompt_embeds_llama3"}) {
    const auto& o = c.raw["outputs"];
    if (o.contains(name) && o[name].contains("shape") && o[name]["shape"].is_array() &&
        !o[name]["shape"].empty())
      return o[name]["shape"].back().get<int64_t>();
  }
  return -1;
}

bool encoder_agrees(const GoldenSet& set, const GoldenCase& c, const std::string& component) {
  const fs::path config_path = fs::path(set.model_dir()) / component / "config.json";
  if (!fs::exists(config_path)) return false;
  const auto cfg = io::JsonConfig::load(config_path.string()).json();
  // Model settings the case may state; token ids are left out (a case's pad_token_id is the
  // tokenizer's, which config.json need not repeat).
  for (const char* key : {"max_position_embeddings", "hidden_act", "vocab_size", "rope_theta",
                          "rope_scaling", "num_key_value_heads", "tie_word_embeddings"})
    if (c.params.contains(key) && cfg.contains(key) && c.params[key] != cfg[key]) return false;
  const int64_t width = output_width(c);
  for (const char* key : {"hidden_size", "d_model"})
    if (width > 0 && cfg.contains(key) && cfg[key].is_number_integer() &&
        cfg[key].get<int64_t>() != width)
      return false;
  // The paired tokenizer (tokenizer_N for text_encoder_N) must give the case's pad id.
  if (c.params.contains("pad_token_id")) {
    std::string tok_component = "tokenizer" + component.substr(std::string("text_encoder").size());
    const fs::path tok_dir = fs::path(set.model_dir()) / tok_component;
    if (fs::is_directory(tok_dir) &&
        !id_agrees(c, "pad_token_id", text::load_tokenizer(tok_dir.string())->pad_id()))
      return false;
  }
  return true;
}

}  // namespace

std::string tokenizer_dir_for(const GoldenSet& set, const GoldenCase& c) {
  if (auto dir = param_dir(set, c, "tokenizer_dir"); !dir.empty()) return dir;
  const auto candidates = components_with_prefix(set, "tokenizer");
  for (const auto& component : candidates) {
    const std::string dir = (fs::path(set.model_dir()) / component).string();
    if (!fs::is_directory(dir)) continue;
    if (tokenizer_agrees(c, *text::load_tokenizer(dir))) return dir;
  }
  // None agrees: the first, whose mismatching ids the runner then reports.
  return (fs::path(set.model_dir()) / candidates.front()).string();
}

std::string text_encoder_component_for(const GoldenSet& set, const GoldenCase& c) {
  if (auto dir = param_dir(set, c, "text_encoder_dir"); !dir.empty())
    return fs::path(dir).filename().string();
  // The text encoder paired with a named tokenizer folder (diffusers: tokenizer_N <->
  // text_encoder_N).
  if (auto dir = param_dir(set, c, "tokenizer_dir"); !dir.empty()) {
    const std::string name = fs::path(dir).filename().string();
    if (name.rfind("tokenizer", 0) == 0) {
      const std::string component = "text_encoder" + name.substr(std::string("tokenizer").size());
      if (fs::is_directory(fs::path(set.model_dir()) / component)) return component;
    }
  }
  const auto candidates = components_with_prefix(set, "text_encoder");
  for (const auto& component : candidates)
    if (encoder_agrees(set, c, component)) return component;
  return candidates.front();
}

}  // namespace diffuse::verify
