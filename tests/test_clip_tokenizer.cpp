// CLIP tokenizer: loading errors and BPE mechanics on a tiny hand-written vocabulary, text
// clean-up details on the real CLIP vocabulary of the golden set.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "diffuse/errors.h"
#include "test_util.h"
#include "text/clip_tokenizer.h"

namespace diffuse {
namespace test_clip_tokenizer {

using text::ClipTokenizer;
using Ids = std::vector<int64_t>;
using Tokens = std::vector<std::string>;

void write(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

// A tokenizer folder with a handful of tokens; merges: a+b -> ab, ab+c</w> -> abc</w>.
// "!" is the pad token (special_tokens_map.json beats tokenizer_config.json, as in the SD2 repos).
struct TinyTokenizer {
  test::TempDir dir;
  TinyTokenizer() {
    write(dir.file("vocab.json"),
          R"({"!": 0, "a": 1, "b": 2, "c": 3, "a</w>": 4, "b</w>": 5, "c</w>": 6, "ab": 7,
              "abc</w>": 8, "<": 9, ">": 10, "x": 11, "x</w>": 12, "<|startoftext|>": 13,
              "<|endoftext|>": 14, "!</w>": 15, "<</w>": 16, "></w>": 17})");
    write(dir.file("merges.txt"), "#version: 0.2\na b\nab c</w>\n");
    write(dir.file("tokenizer_config.json"),
          R"({"model_max_length": 5, "pad_token": "<|endoftext|>",
              "bos_token": {"__type": "AddedToken", "content": "<|startoftext|>"}})");
    write(dir.file("special_tokens_map.json"), R"({"pad_token": "!"})");
  }
  ClipTokenizer load() const { return ClipTokenizer::from_folder(dir.path().string()); }
};

template <typename E>
void expect_error(const std::string& dir, const std::string& needle) {
  try {
    ClipTokenizer::from_folder(dir);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ClipTokenizer, MissingFilesNameTheFile) {
  TinyTokenizer t;
  std::filesystem::remove(t.dir.file("merges.txt"));
  expect_error<IoError>(t.dir.path().string(), "merges.txt");
  std::filesystem::remove(t.dir.file("vocab.json"));
  expect_error<IoError>(t.dir.path().string(), "vocab.json");
  expect_error<IoError>(t.dir.file("no_such_folder"), "no_such_folder");
}

TEST(ClipTokenizer, MalformedVocabIsAFormatError) {
  TinyTokenizer t;
  write(t.dir.file("vocab.json"), R"({"a": 1, "b": )");
  expect_error<FormatError>(t.dir.path().string(), "vocab.json");
  write(t.dir.file("vocab.json"), R"({"a": 1, "b": "two"})");
  expect_error<FormatError>(t.dir.path().string(), "'b'");
  write(t.dir.file("vocab.json"), R"(["a", "b"])");
  expect_error<FormatError>(t.dir.path().string(), "vocab.json");
  write(t.dir.file("vocab.json"), "{}");
  expect_error<FormatError>(t.dir.path().string(), "non-empty");
}

TEST(ClipTokenizer, MalformedMergesAndConfigAreReported) {
  TinyTokenizer t;
  write(t.dir.file("merges.txt"), "#version: 0.2\na b\nabc\n");
  expect_error<FormatError>(t.dir.path().string(), "line 3");
  write(t.dir.file("merges.txt"), "#version: 0.2\n\n");
  expect_error<FormatError>(t.dir.path().string(), "merges.txt");
  write(t.dir.file("merges.txt"), "#version: 0.2\na b\n");
  write(t.dir.file("tokenizer_config.json"), R"({"model_max_length": 1})");
  expect_error<ConfigError>(t.dir.path().string(), "model_max_length");
  write(t.dir.file("tokenizer_config.json"), R"({"pad_token": 5})");
  expect_error<ConfigError>(t.dir.path().string(), "pad_token");
}

TEST(ClipTokenizer, MergesAndVocabMustBelongTogether) {
  TinyTokenizer t;
  write(t.dir.file("merges.txt"), "#version: 0.2\na b\na q\n");
  expect_error<FormatError>(t.dir.path().string(), "line 3: symbol 'q' is not in vocab.json");
  write(t.dir.file("merges.txt"), "#version: 0.2\na b\nb c\n");
  expect_error<FormatError>(t.dir.path().string(), "merged token 'bc' is not in vocab.json");
  write(t.dir.file("merges.txt"), std::string("#version: 0.2\n\x89PNG\x01 \xff\xfe\n", 19));
  expect_error<FormatError>(t.dir.path().string(), "merges.txt: line 2");
  write(t.dir.file("merges.txt"), "#version: 0.2\na b\n");
  write(t.dir.file("vocab.json"), R"({"a": 1, "b": 2, "ab": 1})");
  expect_error<FormatError>(t.dir.path().string(), "id 1 is given to both");
}

TEST(ClipTokenizer, MergesByRankAndMarksWordEnds) {
  const auto tok = TinyTokenizer().load();
  EXPECT_EQ(tok.tokenize("abc"), (Tokens{"abc</w>"}));
  // Upper case is folded; "ab" ends a word, and (a, b</w>) is no merge.
  EXPECT_EQ(tok.tokenize("ABC ab"), (Tokens{"abc</w>", "a", "b</w>"}));
  EXPECT_EQ(tok.encode("abc"), (Ids{13, 8, 14}));
  EXPECT_EQ(tok.encode(""), (Ids{13, 14}));
  EXPECT_EQ(tok.encode("x y"), (Ids{13, 12, 14, 14}));  // "y</w>" is unknown -> unk
  EXPECT_EQ(tok.model_max_length(), 5);
}

TEST(ClipTokenizer, SpecialTokensMapWinsAndSplitsLiterals) {
  TinyTokenizer t;
  auto tok = t.load();
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.bos_id(), 13);
  EXPECT_EQ(tok.eos_id(), 14);
  // The pad token "!" is an added token: split off before clean-up, never merged.
  EXPECT_EQ(tok.encode("c!c"), (Ids{13, 6, 0, 6, 14}));
  EXPECT_EQ(tok.encode("a<|endoftext|>b"), (Ids{13, 4, 14, 5, 14}));

  std::filesystem::remove(t.dir.file("special_tokens_map.json"));
  tok = t.load();
  EXPECT_EQ(tok.pad_id(), 14);
  EXPECT_EQ(tok.encode("c!c"), (Ids{13, 6, 15, 6, 14}));
}

TEST(ClipTokenizer, SingleWordAddedTokenOnlyMatchesAlone) {
  TinyTokenizer t;
  write(t.dir.file("tokenizer_config.json"),
        R"({"added_tokens_decoder": {"18": {"content": "<x>", "single_word": true}}})");
  const auto tok = t.load();
  EXPECT_EQ(tok.encode("a <x>"), (Ids{13, 4, 18, 14}));
  EXPECT_EQ(tok.encode("a<x>"), (Ids{13, 4, 16, 12, 17, 14}));  // glued to "a": plain text
}

TEST(ClipTokenizer, PadsAndTruncatesKeepingEos) {
  const auto tok = TinyTokenizer().load();
  auto batch = tok.encode_padded({"abc", "a b c", "a b c a", "c!c!c!c"});
  ASSERT_EQ(batch.input_ids.size(), 4u);
  EXPECT_EQ(batch.input_ids[0], (Ids{13, 8, 14, 0, 0}));
  EXPECT_EQ(batch.attention_mask[0], (Ids{1, 1, 1, 0, 0}));
  EXPECT_EQ(batch.input_ids[1], (Ids{13, 4, 5, 6, 14}));  // exactly max_length: kept whole
  EXPECT_EQ(batch.input_ids[2], (Ids{13, 4, 5, 6, 14}));  // one too long: last word dropped
  EXPECT_EQ(batch.attention_mask[2], (Ids{1, 1, 1, 1, 1}));
  EXPECT_EQ(batch.input_ids[3], (Ids{13, 6, 0, 6, 14}));
  EXPECT_EQ(batch.truncated, (std::vector<bool>{false, false, true, true}));

  batch = tok.encode_padded({"abc"}, 7);
  EXPECT_EQ(batch.input_ids[0], (Ids{13, 8, 14, 0, 0, 0, 0}));
  EXPECT_THROW(tok.encode_padded({"abc"}, 1), InvalidArgument);
}

TEST(ClipTokenizer, RejectsInvalidUtf8) {
  const auto tok = TinyTokenizer().load();
  EXPECT_THROW(tok.encode("ab\xC3"), InvalidArgument);
  EXPECT_THROW(tok.encode("\xED\xA0\x80"), InvalidArgument);  // encoded surrogate
  EXPECT_THROW(tok.encode("\xC0\xAF"), InvalidArgument);      // overlong "/"
}

// Checks on the real CLIP vocabulary shipped with the golden set.
class RealClipTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = test::golden_dir() + "/model/tokenizer";
    if (!std::filesystem::exists(dir + "/vocab.json")) GTEST_SKIP() << "no tokenizer in " << dir;
    tok_ = std::make_unique<ClipTokenizer>(ClipTokenizer::from_folder(dir));
  }
  Tokens tokens(const std::string& s) const { return tok_->tokenize(s); }
  std::unique_ptr<ClipTokenizer> tok_;
};

TEST_F(RealClipTokenizer, SplitsWordsContractionsAndDigits) {
  EXPECT_EQ(tokens("a photograph of an astronaut"),
            (Tokens{"a</w>", "photograph</w>", "of</w>", "an</w>", "astronaut</w>"}));
  EXPECT_EQ(tokens("Don't 21st"), (Tokens{"don</w>", "'t</w>", "2</w>", "1</w>", "st</w>"}));
  EXPECT_EQ(tok_->encode("")[0], tok_->bos_id());
  EXPECT_EQ(tok_->encode("").size(), 2u);
  EXPECT_EQ(tok_->vocab_size(), 49408u);
}

TEST_F(RealClipTokenizer, CleansTextLikeTransformersBasicTokenizer) {
  // NFC: a decomposed accent tokenizes like the precomposed letter.
  EXPECT_EQ(tokens("cafe\xCC\x81"), tokens("caf\xC3\xA9"));
  // Format characters (zero-width space U+200B, soft hyphen U+00AD) and controls vanish.
  EXPECT_EQ(tokens("con\xE2\x80\x8Btrol soft\xC2\xADhyphen\x07"), tokens("control softhyphen"));
  // CJK ideographs become one word each; kana do not.
  EXPECT_EQ(tokens("\xE6\x9D\xB1\xE4\xBA\xAC"), tokens("\xE6\x9D\xB1 \xE4\xBA\xAC"));
  EXPECT_NE(tokens("\xE3\x82\xBF\xE3\x83\xAF"), tokens("\xE3\x82\xBF \xE3\x83\xAF"));
  // Full lower-casing with the final-sigma rule: ΟΔΟΣ -> οδος.
  EXPECT_EQ(tokens("\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3"), tokens("\xCE\xBF\xCE\xB4\xCE\xBF\xCF\x82"));
  // Unicode spaces (NBSP, ideographic space, line separator) split words.
  EXPECT_EQ(tokens("a\xC2\xA0"
                   "b\xE3\x80\x80"
                   "c\xE2\x80\xA8"
                   "d"),
            tokens("a b c d"));
}

TEST_F(RealClipTokenizer, MatchesCaseInsensitiveRegexQuirks) {
  // A differently-cased special token is not split off first, but the pattern still keeps
  // it whole and BPE leaves it alone.
  EXPECT_EQ(tok_->encode("<|ENDOFTEXT|>")[1], tok_->eos_id());
  // U+0345 is a mark whose upper case is a letter: under IGNORECASE no alternative takes it.
  EXPECT_EQ(tokens("a\xCD\x85"
                   "b"),
            tokens("a b"));
  // U+017F LONG S matches 's' in the contraction "'s": the quote starts a word, not ends one.
  EXPECT_EQ(tokens("it'\xC5\xBF")[1], "'");
  EXPECT_EQ(tokens("it' \xC5\xBF")[1], "'</w>");
}

}  // namespace test_clip_tokenizer
}  // namespace diffuse
