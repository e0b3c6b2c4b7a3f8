// Tokenizer folders other than CLIP's: T5 (SentencePiece) on the HiDream golden set's
// tokenizer_3, the folder recogniser, and bad input (a spiece.model that is not one, a folder
// with no known files, invalid UTF-8). Parser tests: also run by the sanitizer job.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "diffuse/errors.h"
#include "test_util.h"
#include "text/clip_tokenizer.h"
#include "text/llama_tokenizer.h"
#include "text/pretokenizer_regex.h"
#include "text/t5_tokenizer.h"
#include "text/tokenizer.h"

namespace diffuse {
namespace test_text_tokenizers {

namespace fs = std::filesystem;

std::string hidream_model_dir() {
  std::string dir;
  if (const char* env = std::getenv("DIFFUSE_HIDREAM_GOLDEN_DIR"); env && *env) {
    dir = env;
  } else {
    fs::path p(DIFFUSE_DEFAULT_GOLDEN_DIR);
    if (!p.has_filename()) p = p.parent_path();
    dir = (p.parent_path() / "hidream-tiny").string();
  }
  return dir + "/model";
}

// The first tokenizer folder of the set holding `file`, or "" (then the test skips).
std::string tokenizer_with(const std::string& file) {
  const fs::path model(hidream_model_dir());
  if (!fs::is_directory(model)) return "";
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(model))
    if (e.is_directory() && e.path().filename().string().rfind("tokenizer", 0) == 0)
      dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs)
    if (fs::exists(d / file)) return d.string();
  return "";
}

void write(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(T5Tokenizer, EndsWithEosPadsAndTruncates) {
  const auto dir = tokenizer_with("spiece.model");
  if (dir.empty()) GTEST_SKIP() << "no SentencePiece tokenizer folder in " << hidream_model_dir();
  const auto tok = text::T5Tokenizer::from_folder(dir);
  EXPECT_EQ(tok.encode(""), std::vector<int64_t>{tok.eos_id()});
  const auto ids = tok.encode("a photograph of a horse");
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids.back(), tok.eos_id());
  // A literal </s> at the end is not doubled; extra ids are single tokens that eat spaces.
  EXPECT_EQ(tok.encode("a horse </s>").back(), tok.eos_id());
  EXPECT_NE(tok.encode("a horse </s>")[tok.encode("a horse </s>").size() - 2], tok.eos_id());
  const auto extra = tok.encode("a <extra_id_0> b");
  EXPECT_NE(std::find(extra.begin(), extra.end(), tok.vocab_size() - 1), extra.end());
  const auto batch = tok.encode_padded({"a photograph of a horse", ""}, 4);
  ASSERT_EQ(batch.input_ids.size(), 2u);
  EXPECT_EQ(batch.input_ids[0].size(), 4u);
  EXPECT_EQ(batch.input_ids[0].back(), tok.eos_id());
  EXPECT_TRUE(batch.truncated[0]);
  EXPECT_EQ(batch.input_ids[1],
            (std::vector<int64_t>{tok.eos_id(), tok.pad_id(), tok.pad_id(), tok.pad_id()}));
  EXPECT_EQ(batch.attention_mask[1], (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_THROW(tok.encode("bad \xff utf-8"), InvalidArgument);
  EXPECT_THROW(tok.encode_padded({"x"}, 0), InvalidArgument);
}

TEST(T5Tokenizer, RejectsAFileThatIsNotSentencePiece) {
  test::TempDir tmp;
  write(tmp.path() / "spiece.model", "this is not a protobuf \x01\x02\x03");
  const auto msg =
      test::expect_throw<FormatError>([&] { text::T5Tokenizer::from_folder(tmp.path().string()); });
  EXPECT_NE(msg.find("spiece.model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a SentencePiece model"), std::string::npos) << msg;
  write(tmp.path() / "spiece.model", "");
  EXPECT_THROW(text::T5Tokenizer::from_folder(tmp.path().string()), FormatError);
}

TEST(T5Tokenizer, RejectsUnsupportedConfig) {
  const auto dir = tokenizer_with("spiece.model");
  if (dir.empty()) GTEST_SKIP() << "no SentencePiece tokenizer folder";
  test::TempDir tmp;
  fs::copy_file(fs::path(dir) / "spiece.model", tmp.path() / "spiece.model");
  write(tmp.path() / "tokenizer_config.json", R"({"legacy": false})");
  auto msg =
      test::expect_throw<ConfigError>([&] { text::T5Tokenizer::from_folder(tmp.path().string()); });
  EXPECT_NE(msg.find("legacy"), std::string::npos) << msg;
  write(tmp.path() / "tokenizer_config.json", R"({"eos_token": "<no such piece>"})");
  msg =
      test::expect_throw<ConfigError>([&] { text::T5Tokenizer::from_folder(tmp.path().string()); });
  EXPECT_NE(msg.find("<no such piece>"), std::string::npos) << msg;
}

TEST(TokenizerFolder, RecognisedByItsFiles) {
  test::TempDir tmp;
  auto msg = test::expect_throw<IoError>([&] { text::load_tokenizer(tmp.path().string()); });
  EXPECT_NE(msg.find("spiece.model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
  EXPECT_THROW(text::load_tokenizer((tmp.path() / "missing").string()), IoError);
  const auto dir = tokenizer_with("spiece.model");
  if (dir.empty()) GTEST_SKIP() << "no SentencePiece tokenizer folder";
  const auto tok = text::load_tokenizer(dir);
  EXPECT_EQ(tok->kind(), "t5");
  EXPECT_EQ(tok->bos_id(), -1);
}

// A minimal byte-level BPE tokenizer.json: 256 byte tokens, a few merges, one special token.
nlohmann::json tiny_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto chars = text::clip_byte_characters();
  for (int b = 0; b < 256; ++b) vocab[chars[static_cast<size_t>(b)]] = b;
  vocab["ab"] = 256;
  vocab["Ġab"] = 257;
  vocab["Ġa"] = 258;
  nlohmann::json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"ignore_merges", true}};
  j["model"]["merges"] = nlohmann::json::array({"a b", "Ġ a", "Ġa b"});
  j["normalizer"] = nullptr;
  nlohmann::json split = {{"type", "Split"}, {"behavior", "Isolated"}};
  split["pattern"]["Regex"] = R"( ?\p{L}+|\s+|[^\s\p{L}]+)";
  nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  j["pre_tokenizer"] = {{"type", "Sequence"}};
  j["pre_tokenizer"]["pretokenizers"] = nlohmann::json::array({split, byte_level});
  nlohmann::json added = {{"id", 300}, {"content", "<|bos|>"}, {"special", true}};
  j["added_tokens"] = nlohmann::json::array({added});
  nlohmann::json bos_item, seq_item;
  bos_item["SpecialToken"]["id"] = "<|bos|>";
  seq_item["Sequence"]["id"] = "A";
  j["post_processor"] = {{"type", "TemplateProcessing"}};
  j["post_processor"]["single"] = nlohmann::json::array({bos_item, seq_item});
  j["post_processor"]["special_tokens"]["<|bos|>"]["id"] = "<|bos|>";
  j["post_processor"]["special_tokens"]["<|bos|>"]["ids"] = nlohmann::json::array({300});
  return j;
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  write(path, j.dump());
}

TEST(LlamaTokenizer, ByteLevelBpeWithTemplateAndPadding) {
  test::TempDir tmp;
  write_json(tmp.path() / "tokenizer.json", tiny_tokenizer_json());
  write_json(tmp.path() / "tokenizer_config.json", {{"eos_token", "<|bos|>"}});
  const auto tok = text::LlamaTokenizer::from_folder(tmp.path().string());
  EXPECT_EQ(tok.encode("ab ab"), (std::vector<int64_t>{300, 256, 257}));
  EXPECT_EQ(tok.encode("<|bos|>ab"), (std::vector<int64_t>{300, 300, 256}));
  const auto batch = tok.encode_padded({"ab ab ab", "ab"}, 3);
  EXPECT_EQ(batch.input_ids[0], (std::vector<int64_t>{300, 256, 257}));
  EXPECT_TRUE(batch.truncated[0]);
  EXPECT_EQ(batch.input_ids[1], (std::vector<int64_t>{300, 256, 300}));
  EXPECT_EQ(batch.attention_mask[1], (std::vector<int64_t>{1, 1, 0}));
  EXPECT_THROW(tok.encode("bad \xc3\x28"), InvalidArgument);
  EXPECT_EQ(text::load_tokenizer(tmp.path().string())->kind(), "llama");
}

// shared_tokenizer parses a folder once and hands the same tokenizer to every caller; a file
// written again (another size) is read again; a missing folder is load_tokenizer's error.
TEST(TokenizerFolder, SharedTokenizerLoadsAFolderOnceUntilItChanges) {
  test::TempDir tmp;
  write_json(tmp.path() / "tokenizer.json", tiny_tokenizer_json());
  const auto first = text::shared_tokenizer(tmp.path().string());
  EXPECT_EQ(first->kind(), "llama");
  EXPECT_EQ(text::shared_tokenizer(tmp.path().string()), first);
  EXPECT_EQ(text::shared_tokenizer((tmp.path() / ".").string()), first) << "the same folder";
  auto changed = tiny_tokenizer_json();
  changed["model"]["vocab"]["ba"] = 259;
  changed["model"]["merges"].push_back("b a");
  write_json(tmp.path() / "tokenizer.json", changed);
  const auto second = text::shared_tokenizer(tmp.path().string());
  EXPECT_NE(second, first);
  EXPECT_EQ(second->encode("ba"), (std::vector<int64_t>{300, 259}));
  EXPECT_EQ(first->encode("ba"), (std::vector<int64_t>{300, 98, 97}))
      << "the old one stays as it was";
  EXPECT_THROW(text::shared_tokenizer((tmp.path() / "missing").string()), IoError);
}

// An empty match splits the text around it but is no piece, and no character is lost (as in
// tokenizers' Split; Llama-3's own regex never matches empty).
TEST(PretokenizerRegex, EmptyMatchesSplitWithoutLosingText) {
  const text::PretokenizerRegex regex("x*", "test");
  std::vector<std::string> pieces;
  regex.split("abxxc", [&](std::string_view p) { pieces.emplace_back(p); });
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "b", "xx", "c"}));
  const auto msg = test::expect_throw<ConfigError>([] { text::PretokenizerRegex("(", "here"); });
  EXPECT_NE(msg.find("here: regex rejected by PCRE2"), std::string::npos) << msg;
}

TEST(LlamaTokenizer, RejectsBrokenFiles) {
  test::TempDir tmp;
  const auto file = tmp.path() / "tokenizer.json";
  auto expect = [&](const nlohmann::json& j, const std::string& part) {
    write_json(file, j);
    try {
      text::LlamaTokenizer::from_folder(tmp.path().string());
      ADD_FAILURE() << "no error for " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    }
  };
  auto j = tiny_tokenizer_json();
  j["model"]["type"] = "Unigram";
  expect(j, "Unigram");
  j = tiny_tokenizer_json();
  j["model"]["merges"].push_back("x yz");
  expect(j, "'yz', which is not in model.vocab");
  j = tiny_tokenizer_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect(j, "PCRE2");
  j = tiny_tokenizer_json();
  j["normalizer"] = {{"type", "Lowercase"}};  // NFC (Qwen2's) is supported
  expect(j, "normalizer");
  // Fields of another type than expected (found by the fuzzer: an uncaught nlohmann type_error).
  j = tiny_tokenizer_json();
  j["model"]["ignore_merges"] = "yes";
  expect(j, "wrong type");
  j = tiny_tokenizer_json();
  j["model"]["byte_fallback"] = 1;
  expect(j, "wrong type");
  write(file, "{ not json");
  EXPECT_THROW(text::LlamaTokenizer::from_folder(tmp.path().string()), FormatError);
}

// A Qwen2 folder (vocab.json + merges.txt + tokenizer_config.json naming Qwen2Tokenizer): the
// 256 byte tokens, one merge, two added tokens.
void write_qwen2_folder(const fs::path& dir, const std::string& merges) {
  fs::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object();
  const auto bytes = text::clip_byte_characters();
  for (int b = 0; b < 256; ++b) vocab[bytes[static_cast<size_t>(b)]] = b;
  vocab["ab"] = 256;
  vocab["\u00c3\u00a9"] = 257;  // "é" as its two UTF-8 bytes' characters
  write_json(dir / "vocab.json", vocab);
  std::ofstream(dir / "merges.txt") << merges;
  write_json(dir / "tokenizer_config.json",
             {{"tokenizer_class", "Qwen2Tokenizer"},
              {"eos_token", "<|im_end|>"},
              {"pad_token", "<|endoftext|>"},
              {"added_tokens_decoder",
               {{"300", {{"content", "<|endoftext|>"}, {"special", true}}},
                {"301", {{"content", "<|im_end|>"}, {"special", true}}}}}});
}

TEST(Qwen2Tokenizer, MergesNormalisesAndSplitsAddedTokens) {
  test::TempDir tmp;
  write_qwen2_folder(tmp.path(), "#version: 0.2\na b\n\u00c3 \u00a9\n");
  const auto tok = text::load_tokenizer(tmp.path().string());
  EXPECT_EQ(tok->kind(), "qwen2");
  EXPECT_EQ(tok->eos_id(), 301);
  EXPECT_EQ(tok->pad_id(), 300);
  EXPECT_EQ(tok->encode("ab<|im_end|>"), (std::vector<int64_t>{256, 301}));
  // NFC first: "e" + combining acute is the precomposed "é".
  EXPECT_EQ(tok->encode("e\u0301"), tok->encode("\u00e9"));
  EXPECT_EQ(tok->encode("\u00e9"), (std::vector<int64_t>{257}));
}

TEST(Qwen2Tokenizer, RejectsBrokenFiles) {
  test::TempDir tmp;
  write_qwen2_folder(tmp.path(), "#version: 0.2\na zz\n");
  auto msg = test::expect_throw<FormatError>([&] { text::load_tokenizer(tmp.path().string()); });
  EXPECT_NE(msg.find("merges.txt: line 2"), std::string::npos) << msg;
  write_qwen2_folder(tmp.path(), "#version: 0.2\na b c\n");
  msg = test::expect_throw<FormatError>([&] { text::load_tokenizer(tmp.path().string()); });
  EXPECT_NE(msg.find("not two tokens"), std::string::npos) << msg;
  write_qwen2_folder(tmp.path(), "a b\n");
  write_json(tmp.path() / "vocab.json", {{"a", 0}});
  msg = test::expect_throw<FormatError>([&] { text::load_tokenizer(tmp.path().string()); });
  EXPECT_NE(msg.find("byte token"), std::string::npos) << msg;
}

}  // namespace test_text_tokenizers
}  // namespace diffuse
