#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "diffuse/errors.h"
#include "test_util.h"
#include "text/llama_bpe_trainer.h"
#include "text/llama_tokenizer.h"
#include "text/t5_tokenizer.h"
#include "text/t5_tokenizer_trainer.h"

namespace diffuse {
namespace test_tokenizer_trainers {

namespace fs = std::filesystem;

// Captions and edit prompts of the kind the HiDream demo model trains on.
std::vector<std::string> scene_corpus() {
  const std::vector<std::string> colors = {"red", "blue", "green", "yellow", "purple"};
  const std::vector<std::string> shapes = {"circle", "square", "triangle"};
  std::vector<std::string> out;
  for (size_t i = 0; i < 30; ++i) {
    const auto& c1 = colors[i % 5];
    const auto& c2 = colors[(i + 1) % 5];
    const auto& c3 = colors[(i + 3) % 5];
    const auto& s1 = shapes[i % 3];
    const auto& s2 = shapes[(i + 1) % 3];
    out.push_back("a " + c1 + " " + s1 + " on the left and a " + c2 + " " + s2 +
                  " on the right on a " + c3 + " background");
    out.push_back("Editing Instruction: make the background " + c2 +
                  ". Target Image Description: a " + c1 + " " + s1 + " on a " + c2 + " background");
  }
  return out;
}

// Every file of a folder, name -> bytes.
std::map<std::string, std::string> folder_files(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    files[entry.path().filename().string()] = ss.str();
  }
  return files;
}

// Each sentence's ids (text and at least one special token), checked to lie in [0, vocab_size).
template <typename Tokenizer>
std::vector<std::vector<int64_t>> encode_all(const Tokenizer& tok,
                                             const std::vector<std::string>& corpus,
                                             int64_t vocab_size) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& text : corpus) {
    out.push_back(tok.encode(text));
    EXPECT_GE(out.back().size(), 2u) << text;
    for (auto id : out.back()) {
      EXPECT_GE(id, 0) << text;
      EXPECT_LT(id, vocab_size) << text;
    }
  }
  return out;
}

TEST(TokenizerTrainers, T5EncodesWithEosInsideTheVocabulary) {
  test::TempDir tmp;
  const auto corpus = scene_corpus();
  text::train_t5_tokenizer(corpus, 200, tmp.file("t5"), 77);
  const auto tok = text::T5Tokenizer::from_folder(tmp.file("t5"));
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.unk_id(), 2);
  EXPECT_EQ(tok.model_max_length(), 77);
  for (const auto& ids : encode_all(tok, corpus, tok.vocab_size())) {
    EXPECT_EQ(ids.back(), tok.eos_id());
    // character_coverage 1.0: every character of the corpus is known.
    EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.unk_id()), 0);
  }
  // A character the corpus never had becomes SentencePiece's <unk>; the rest still encodes.
  const auto unseen = tok.encode("a red circle \xc3\xbc");
  EXPECT_EQ(unseen.back(), tok.eos_id());
  EXPECT_NE(std::find(unseen.begin(), unseen.end(), tok.unk_id()), unseen.end());
  const auto batch = tok.encode_padded({"a red circle"}, 16);
  EXPECT_EQ(batch.input_ids[0].size(), 16u);
  EXPECT_EQ(batch.input_ids[0].back(), tok.pad_id());
}

TEST(TokenizerTrainers, LlamaStartsWithBosAndLearnsFrequentWords) {
  test::TempDir tmp;
  const auto corpus = scene_corpus();
  text::train_llama_tokenizer(corpus, 300, tmp.file("llama"), 128);
  const auto tok = text::LlamaTokenizer::from_folder(tmp.file("llama"));
  EXPECT_EQ(tok.model_max_length(), 128);
  // Ids: 256 bytes, the merges' tokens, then <|begin_of_text|> and <|end_of_text|>.
  EXPECT_GT(tok.bos_id(), 256);
  EXPECT_EQ(tok.eos_id(), tok.bos_id() + 1);
  EXPECT_EQ(tok.pad_id(), tok.eos_id());  // no pad token: padding with EOS, as HiDream does
  EXPECT_EQ(static_cast<int64_t>(tok.vocab_size()), tok.eos_id() + 1);
  for (const auto& ids : encode_all(tok, corpus, static_cast<int64_t>(tok.vocab_size()))) {
    EXPECT_EQ(ids.front(), tok.bos_id());
    EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.bos_id()), 1);
  }
  // Frequent words are one token each, with the space before them (the regex's " ?\p{L}+").
  EXPECT_EQ(tok.encode(" circle").size(), 2u);
  EXPECT_EQ(tok.encode("a red circle on the left").size(), 7u);
  // Unseen text falls back to byte tokens, whose ids are the byte values.
  EXPECT_EQ(tok.encode("\xc3\xbc"), (std::vector<int64_t>{tok.bos_id(), 0xc3, 0xbc}));
  EXPECT_EQ(tok.encode("<|end_of_text|>"), (std::vector<int64_t>{tok.bos_id(), tok.eos_id()}));
  const auto batch = tok.encode_padded({"a red circle"}, 8);
  EXPECT_EQ(batch.input_ids[0].size(), 8u);
  EXPECT_EQ(batch.input_ids[0].back(), tok.eos_id());
}

TEST(TokenizerTrainers, SameCorpusGivesSameFiles) {
  test::TempDir tmp;
  const auto corpus = scene_corpus();
  for (const char* run : {"a", "b"}) {
    text::train_t5_tokenizer(corpus, 200, tmp.file(std::string("t5_") + run), 512);
    text::train_llama_tokenizer(corpus, 300, tmp.file(std::string("llama_") + run), 2048);
  }
  for (const char* kind : {"t5_", "llama_"}) {
    const auto a = folder_files(tmp.path() / (std::string(kind) + "a"));
    const auto b = folder_files(tmp.path() / (std::string(kind) + "b"));
    EXPECT_EQ(a.size(), 3u) << kind;
    EXPECT_TRUE(a == b) << kind << " files differ between two trainings";
  }
  const std::string text = corpus[1];
  EXPECT_EQ(text::T5Tokenizer::from_folder(tmp.file("t5_a")).encode(text),
            text::T5Tokenizer::from_folder(tmp.file("t5_b")).encode(text));
  EXPECT_EQ(text::LlamaTokenizer::from_folder(tmp.file("llama_a")).encode(text),
            text::LlamaTokenizer::from_folder(tmp.file("llama_b")).encode(text));
}

TEST(TokenizerTrainers, RefuseBadInputWithClearErrors) {
  test::TempDir tmp;
  for (const auto& corpus : {std::vector<std::string>{}, std::vector<std::string>{"", ""}}) {
    auto msg = test::expect_throw<InvalidArgument>(
        [&] { text::train_t5_tokenizer(corpus, 100, tmp.file("t5"), 512); });
    EXPECT_NE(msg.find("corpus"), std::string::npos) << msg;
    msg = test::expect_throw<InvalidArgument>(
        [&] { text::train_llama_tokenizer(corpus, 100, tmp.file("llama"), 512); });
    EXPECT_NE(msg.find("corpus"), std::string::npos) << msg;
  }
  // Text that SentencePiece's input filter erases (white space, controls, U+FFFD) would make
  // libsentencepiece abort the process: the T5 trainer refuses it first.
  const std::vector<std::string> invisible = {" \n\t", "\xef\xbf\xbd \x01"};
  auto msg = test::expect_throw<InvalidArgument>(
      [&] { text::train_t5_tokenizer(invisible, 100, tmp.file("t5"), 512); });
  EXPECT_NE(msg.find("corpus"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(tmp.path() / "t5"));
  const std::vector<std::string> bad_utf8 = {"fine", "bad \xc3\x28"};
  msg = test::expect_throw<InvalidArgument>(
      [&] { text::train_t5_tokenizer(bad_utf8, 100, tmp.file("t5"), 512); });
  EXPECT_NE(msg.find("sentence 1"), std::string::npos) << msg;
  msg = test::expect_throw<InvalidArgument>(
      [&] { text::train_llama_tokenizer(bad_utf8, 100, tmp.file("llama"), 512); });
  EXPECT_NE(msg.find("sentence 1"), std::string::npos) << msg;
  // A vocabulary smaller than the corpus's alphabet: SentencePiece's own message, no abort.
  msg = test::expect_throw<InvalidArgument>(
      [&] { text::train_t5_tokenizer(scene_corpus(), 10, tmp.file("t5"), 512); });
  EXPECT_NE(msg.find("required_chars"), std::string::npos) << msg;
  EXPECT_THROW(text::train_t5_tokenizer(scene_corpus(), 3, tmp.file("t5"), 512), InvalidArgument);
  EXPECT_THROW(text::train_llama_tokenizer(scene_corpus(), -1, tmp.file("llama"), 512),
               InvalidArgument);
}

}  // namespace test_tokenizer_trainers
}  // namespace diffuse
