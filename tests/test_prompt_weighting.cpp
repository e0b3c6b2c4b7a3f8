// AUTOMATIC1111's prompt syntax: the attention parser against A1111's own documented examples,
// clamping, escapes, unbalanced brackets, and chunking into 75-token pieces with the real
// CLIP vocabulary (when the golden set is present).
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "diffuse/errors.h"
#include "test_util.h"
#include "text/clip_tokenizer.h"
#include "text/lora_tags.h"
#include "text/prompt_weighting.h"

namespace diffuse {
namespace test_prompt_weighting {

using text::parse_prompt_attention;
using Parsed = std::vector<std::pair<std::string, double>>;

Parsed parse(const std::string& prompt, std::vector<std::string>* warnings = nullptr) {
  Parsed out;
  for (const auto& p : parse_prompt_attention(prompt, warnings))
    out.emplace_back(p.is_break ? "BREAK" : p.text, p.weight);
  return out;
}

void expect_parsed(const std::string& prompt, const Parsed& want) {
  SCOPED_TRACE(prompt);
  const auto got = parse(prompt);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << i;
    EXPECT_NEAR(got[i].second, want[i].second, 1e-12) << i;
  }
}

// The examples in the docstring of A1111's modules/prompt_parser.py parse_prompt_attention.
TEST(PromptAttention, MatchesA1111sDocumentedExamples) {
  expect_parsed("normal text", {{"normal text", 1.0}});
  expect_parsed("an (important) word", {{"an ", 1.0}, {"important", 1.1}, {" word", 1.0}});
  expect_parsed("(unbalanced", {{"unbalanced", 1.1}});
  expect_parsed("\\(literal\\]", {{"(literal]", 1.0}});
  expect_parsed("(unnecessary)(parens)", {{"unnecessaryparens", 1.1}});
  expect_parsed("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
                {{"a ", 1.0},
                 {"house", 1.1 * 1.1 * 1.3},
                 {" ", 1.1},
                 {"on", 1.0},
                 {" a ", 1.1},
                 {"hill", 0.55},
                 {", sun, ", 1.1},
                 {"sky", 1.1 * 1.1 * 1.1 * 1.1},
                 {".", 1.1}});
}

TEST(PromptAttention, BreaksNumbersEmptyAndUnbalanced) {
  expect_parsed("a BREAK b", {{"a", 1.0}, {"BREAK", -1.0}, {"b", 1.0}});
  expect_parsed("BREAKFAST BREAK", {{"BREAKFAST", 1.0}, {"BREAK", -1.0}, {"", 1.0}});
  expect_parsed("(a:.5)", {{"a", 0.5}});
  expect_parsed("[[a]]", {{"a", 1 / 1.1 / 1.1}});
  expect_parsed("()", {{"", 1.0}});
  expect_parsed("", {{"", 1.0}});
  expect_parsed("a) b] c:", {{"a) b] c:", 1.0}});
  expect_parsed("time: 5:30 (x:2)", {{"time: 5:30 ", 1.0}, {"x", 2.0}});
  expect_parsed("back\\slash \\\\", {{"backslash \\", 1.0}});
  std::vector<std::string> warnings;
  const auto big = parse("(a:1e3) (b:-50)", &warnings);
  ASSERT_EQ(big.size(), 3u);
  EXPECT_DOUBLE_EQ(big[0].second, text::kMaxPromptWeight);
  EXPECT_DOUBLE_EQ(big[2].second, -text::kMaxPromptWeight);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("1000 of 'a'"), std::string::npos) << warnings[0];
}

TEST(PromptAttention, LongInputIsLinearNotRecursive) {
  // 200 000 characters of text and 50 000 nested brackets: no stack overflow, one piece each.
  const std::string text(200000, 'a');
  EXPECT_EQ(parse(text).size(), 1u);
  const std::string nested = std::string(50000, '(') + "x" + std::string(50000, ')');
  const auto p = parse(nested);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].first, "x");
  EXPECT_DOUBLE_EQ(p[0].second, text::kMaxPromptWeight);  // 1.1^50000, clamped
}

TEST(LoraTags, AreTakenOutOfThePromptWithTheirScales) {
  std::vector<text::LoraTag> tags;
  EXPECT_EQ(text::extract_lora_tags("a <lora:film:0.7>fox<lora:grain> <lora:x", &tags),
            "a fox <lora:x");
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].name, "film");
  EXPECT_DOUBLE_EQ(tags[0].scale, 0.7);
  EXPECT_EQ(tags[1].name, "grain");
  EXPECT_DOUBLE_EQ(tags[1].scale, 1.0);
  EXPECT_THROW(text::extract_lora_tags("<lora:a:lots>", &tags), InvalidArgument);
  EXPECT_THROW(text::extract_lora_tags("<lora::1>", &tags), InvalidArgument);
  // A scale that would overflow the weights' update: refused with the prompt, not NaN later.
  const auto msg = test::expect_throw<InvalidArgument>(
      [&] { text::extract_lora_tags("<lora:x:1e308>", &tags); });
  EXPECT_NE(msg.find("not a number in [-100, 100]"), std::string::npos) << msg;
  EXPECT_THROW(text::resolve_lora_tag({"a", 1.0}, ""), InvalidArgument);
  EXPECT_THROW(text::resolve_lora_tag({"/etc/passwd", 1.0}, "/tmp"), InvalidArgument);
}

class PromptChunks : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::golden_dir() + "/model/tokenizer";
    if (!std::filesystem::exists(dir_ + "/vocab.json")) GTEST_SKIP() << "no tokenizer in " << dir_;
  }
  text::ClipTokenizer tok() const { return text::ClipTokenizer::from_folder(dir_); }
  std::string dir_;
};

TEST_F(PromptChunks, PlainPromptIsOneChunkEqualToThePlainTokenizer) {
  const auto t = tok();
  const std::string prompt = "a photograph of an astronaut riding a horse";
  const auto chunks = text::chunk_prompt(t, parse_prompt_attention(prompt));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].ids, t.encode_padded({prompt}).input_ids[0]);
  EXPECT_TRUE(chunks[0].all_weights_one());
}

TEST_F(PromptChunks, LongPromptsBreaksAndWeightsMakeChunksOf75) {
  const auto t = tok();
  std::ostringstream words;
  for (int i = 0; i < 300; ++i) words << "cat ";
  const auto chunks = text::chunk_prompt(t, parse_prompt_attention(words.str()));
  ASSERT_EQ(chunks.size(), 4u);  // 300 tokens = 4 x 75
  for (const auto& c : chunks) {
    ASSERT_EQ(c.ids.size(), static_cast<size_t>(t.model_max_length()));
    EXPECT_EQ(c.ids.front(), t.bos_id());
    EXPECT_EQ(c.ids[76], t.eos_id());
  }
  const auto broken = text::chunk_prompt(t, parse_prompt_attention("a red fox BREAK a blue sky"));
  ASSERT_EQ(broken.size(), 2u);
  EXPECT_EQ(broken[1].ids, t.encode_padded({"a blue sky"}).input_ids[0]);
  const auto weighted = text::chunk_prompt(t, parse_prompt_attention("a (red:1.5) fox"));
  ASSERT_EQ(weighted.size(), 1u);
  EXPECT_FLOAT_EQ(weighted[0].weights[2], 1.5f);  // BOS, "a", "red"
  EXPECT_FLOAT_EQ(weighted[0].weights[1], 1.0f);
}

// A pasted prompt of thousands of BREAKs is refused at the bound, not encoded chunk by chunk.
TEST_F(PromptChunks, TooManyChunksAreRefusedNamingTheBound) {
  const auto t = tok();
  std::string at_bound = "x";
  for (size_t i = 1; i < text::kMaxPromptChunks; ++i) at_bound += " BREAK x";
  EXPECT_EQ(text::chunk_prompt(t, parse_prompt_attention(at_bound)).size(), text::kMaxPromptChunks);
  std::string pasted;
  for (int i = 0; i < 20000; ++i) pasted += "BREAK ";
  const auto m = test::expect_throw<InvalidArgument>(
      [&] { text::chunk_prompt(t, parse_prompt_attention(pasted)); });
  EXPECT_NE(m.find("more than " + std::to_string(text::kMaxPromptChunks) + " chunks"),
            std::string::npos)
      << m;
}

TEST_F(PromptChunks, AChunkEndingSoonAfterACommaIsCutAfterTheComma) {
  const auto t = tok();
  // 70 words, a comma, then 10 more words: the chunk ends after the comma (5 tokens before the
  // limit), and the 10 words start the next one.
  std::ostringstream p;
  for (int i = 0; i < 70; ++i) p << "cat ";
  p << ", ";
  for (int i = 0; i < 10; ++i) p << "dog ";
  const auto chunks = text::chunk_prompt(t, parse_prompt_attention(p.str()));
  ASSERT_EQ(chunks.size(), 2u);
  const int64_t comma = t.token_to_id(",</w>");
  EXPECT_EQ(chunks[0].ids[71], comma);
  EXPECT_EQ(chunks[0].ids[72], t.eos_id());
  EXPECT_EQ(chunks[1].ids[1], t.token_to_id("dog</w>"));
}

}  // namespace test_prompt_weighting
}  // namespace diffuse
