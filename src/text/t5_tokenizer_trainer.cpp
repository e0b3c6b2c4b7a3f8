#include "text/t5_tokenizer_trainer.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "diffuse/errors.h"
#include "text/sentencepiece_model.h"
#include "text/tokenizer_files.h"
#include "text/unicode.h"

namespace diffuse::text {
namespace {

// SentencePiece's default limit on a training line.
constexpr size_t kMaxLineBytes = 4192;

// True if some character survives SentencePiece's training input filter (nmt_nfkc drops
// controls and folds white space; U+FFFD and its own space mark U+2581 are skipped):
// libsentencepiece aborts the process on a corpus without any such character.
bool has_visible_text(const std::u32string& text) {
  for (char32_t c : text)
    if (!is_white_space(c) && !is_other(c) && c != U'\uFFFD' && c != U'\u2581') return true;
  return false;
}

}  // namespace

void train_t5_tokenizer(const std::vector<std::string>& corpus, int vocab_size,
                        const std::string& dir, int64_t model_max_length) {
  const std::string what = "T5 tokenizer training";
  // <pad>, </s>, <unk> and at least one character.
  if (vocab_size < 4)
    throw InvalidArgument(what + ": vocab_size " + std::to_string(vocab_size) +
                          " is too small (need at least 4)");
  check_training_input(corpus, model_max_length, what);
  std::string lines;
  bool visible = false;
  for (const auto& text : corpus) {
    // SentencePiece trains on lines and skips those longer than max_sentence_length.
    for (size_t start = 0; start <= text.size() && !visible;) {
      const size_t end = std::min(text.find('\n', start), text.size());
      visible = end - start <= kMaxLineBytes &&
                has_visible_text(utf8_decode(text.substr(start, end - start)));
      start = end + 1;
    }
    lines += text;
    lines += '\n';
  }
  if (!visible)
    throw InvalidArgument(what + ": the corpus has no text (" + std::to_string(corpus.size()) +
                          " sentences, no line of at most " + std::to_string(kMaxLineBytes) +
                          " bytes with a visible character)");

  // T5's layout and determinism (sample nothing, keep the order, one thread). BPE rather than
  // T5's unigram: on a small corpus of few distinct words the unigram trainer seeds only
  // substrings seen twice among the distinct words and ends near character level (a caption
  // of ~30 words became ~90 ids), while BPE merges every frequent word into one piece; the file
  // format and T5Tokenizer are the same. hard_vocab_limit=false: a small corpus cannot fill
  // vocab_size.
  // minloglevel=1: no progress log (libsentencepiece still prints its command line once).
  const std::string args = "--model_type=bpe --vocab_size=" + std::to_string(vocab_size) +
                           " --pad_id=0 --pad_piece=<pad> --eos_id=1 --eos_piece=</s>"
                           " --unk_id=2 --unk_piece=<unk> --bos_id=-1"
                           " --character_coverage=1.0 --input_sentence_size=0"
                           " --shuffle_input_sentence=false --num_threads=1"
                           " --hard_vocab_limit=false --minloglevel=1"
                           " --max_sentence_length=" +
                           std::to_string(kMaxLineBytes);
  create_tokenizer_folder(dir);
  train_sentencepiece(args, lines, (std::filesystem::path(dir) / "spiece.model").string());

  const nlohmann::ordered_json special{
      {"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}};
  nlohmann::ordered_json config = special;
  config["additional_special_tokens"] = nlohmann::ordered_json::array();
  config["clean_up_tokenization_spaces"] = true;
  config["extra_ids"] = 0;
  config["legacy"] = true;
  config["model_max_length"] = model_max_length;
  config["sp_model_kwargs"] = nlohmann::ordered_json::object();
  config["tokenizer_class"] = "T5Tokenizer";
  write_tokenizer_json(dir, "special_tokens_map.json", special);
  write_tokenizer_json(dir, "tokenizer_config.json", config);
}

}  // namespace diffuse::text
