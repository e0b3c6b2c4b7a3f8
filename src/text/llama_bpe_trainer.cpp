#include "text/llama_bpe_trainer.h"

#include <nlohmann/json.hpp>

#include "diffuse/errors.h"
#include "text/bpe_merges.h"
#include "text/clip_tokenizer.h"
#include "text/pretokenizer_regex.h"
#include "text/tokenizer_files.h"

namespace diffuse::text {
namespace {

using Json = nlohmann::ordered_json;

// Llama-3's Split regex, as its tokenizer.json spells it.
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kBos = "<|begin_of_text|>";
const char* const kEos = "<|end_of_text|>";

Json added_token(int64_t id, const char* content) {
  return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
              {"rstrip", false}, {"normalized", false}, {"special", true}};
}

Json byte_level(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return Json{{"type", "ByteLevel"},
              {"add_prefix_space", add_prefix_space},
              {"trim_offsets", trim_offsets},
              {"use_regex", use_regex}};
}

// Llama-3's post-processor: BOS before the sequence (and before the second one of a pair).
Json bos_template(int64_t bos_id) {
  auto special = [](int type_id) {
    return Json{{"SpecialToken", {{"id", kBos}, {"type_id", type_id}}}};
  };
  auto sequence = [](const char* id, int type_id) {
    return Json{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  Json t{{"type", "TemplateProcessing"}};
  t["single"] = Json::array({special(0), sequence("A", 0)});
  t["pair"] = Json::array({special(0), sequence("A", 0), special(1), sequence("B", 1)});
  t["special_tokens"][kBos] = {
      {"id", kBos}, {"ids", Json::array({bos_id})}, {"tokens", Json::array({kBos})}};
  return t;
}

Json tokenizer_json(const std::vector<std::string>& tokens, const std::vector<BpeMerge>& merges) {
  const auto bos_id = static_cast<int64_t>(tokens.size());
  Json j{{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}};
  j["added_tokens"] = Json::array({added_token(bos_id, kBos), added_token(bos_id + 1, kEos)});
  j["normalizer"] = nullptr;
  Json split{{"type", "Split"},
             {"pattern", {{"Regex", kLlama3Pattern}}},
             {"behavior", "Isolated"},
             {"invert", false}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", Json::array({split, byte_level(false, true, false)})}};
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors", Json::array({byte_level(true, false, true), bos_template(bos_id)})}};
  j["decoder"] = byte_level(true, true, true);
  Json model{{"type", "BPE"},
             {"dropout", nullptr},
             {"unk_token", nullptr},
             {"continuing_subword_prefix", nullptr},
             {"end_of_word_suffix", nullptr},
             {"fuse_unk", false},
             {"byte_fallback", false},
             {"ignore_merges", true}};
  model["vocab"] = Json::object();
  for (size_t i = 0; i < tokens.size(); ++i) model["vocab"][tokens[i]] = i;
  // "left right" strings, as Llama-3's file has them: byte characters never include a space.
  model["merges"] = Json::array();
  for (const auto& [a, b] : merges) model["merges"].push_back(a + " " + b);
  j["model"] = std::move(model);
  return j;
}

}  // namespace

void train_llama_tokenizer(const std::vector<std::string>& corpus, int num_merges,
                           const std::string& dir, int64_t model_max_length) {
  const std::string what = "Llama tokenizer training";
  if (num_merges < 0)
    throw InvalidArgument(what + ": num_merges " + std::to_string(num_merges) + " is negative");
  // Also the UTF-8 check the regex needs (it runs without its own).
  check_training_input(corpus, model_max_length, what);
  const auto bytes = clip_byte_characters();
  const PretokenizerRegex regex(kLlama3Pattern, what);
  BpeWordCounts words;
  for (const auto& text : corpus) {
    regex.split(text, [&](std::string_view piece) {
      std::vector<std::string> symbols;
      for (unsigned char b : piece) symbols.push_back(bytes[b]);
      words[symbols]++;
    });
  }
  if (words.empty())
    throw InvalidArgument(what + ": the corpus has no text (" + std::to_string(corpus.size()) +
                          " sentences, all empty)");

  std::vector<std::string> tokens(bytes.begin(), bytes.end());
  const auto merges = learn_bpe_merges(words, num_merges, tokens);

  create_tokenizer_folder(dir);
  write_tokenizer_json(dir, "tokenizer.json", tokenizer_json(tokens, merges));
  const Json special{{"bos_token", kBos}, {"eos_token", kEos}};
  Json config = special;
  config["clean_up_tokenization_spaces"] = true;
  config["model_input_names"] = Json::array({"input_ids", "attention_mask"});
  config["model_max_length"] = model_max_length;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  write_tokenizer_json(dir, "special_tokens_map.json", special);
  write_tokenizer_json(dir, "tokenizer_config.json", config);
}

}  // namespace diffuse::text
