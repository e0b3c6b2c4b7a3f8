#include <gtest/gtest.h>

#include "test_util.h"
#include "text/bpe_trainer.h"
#include "text/clip_tokenizer.h"

namespace diffuse {
namespace test_bpe_trainer {

TEST(BpeTrainer, LearnsFrequentPairsAndRoundTripsThroughTheTokenizer) {
  std::vector<std::string> corpus = {"a cat on a mat", "the cat sat", "a cat, a hat and a cat"};
  auto vocab = text::train_clip_bpe(corpus, 20);
  ASSERT_FALSE(vocab.merges.empty());
  EXPECT_LE(vocab.tokens.size(), 512 + vocab.merges.size() + 2);
  EXPECT_EQ(vocab.tokens.back(), "<|endoftext|>");
  test::TempDir dir;
  text::save_clip_tokenizer(vocab, dir.path().string(), 16);
  auto tok = text::ClipTokenizer::from_folder(dir.path().string());
  EXPECT_EQ(tok.model_max_length(), 16);
  // "cat" is the most frequent word, so it becomes a single token.
  auto ids = tok.encode("cat");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.front(), tok.bos_id());
  EXPECT_EQ(ids.back(), tok.eos_id());
  EXPECT_EQ(tok.tokenize("cat"), std::vector<std::string>{"cat</w>"});
  // Unseen text still encodes through single-byte tokens.
  auto unseen = tok.encode("zebra 🦓");
  EXPECT_GT(unseen.size(), 5u);
  auto batch = tok.encode_padded({"a cat", "one two three four five six seven eight nine ten"});
  EXPECT_EQ(batch.input_ids[0].size(), 16u);
  EXPECT_FALSE(batch.truncated[0]);
  EXPECT_TRUE(batch.truncated[1]);
}

TEST(BpeTrainer, IsDeterministic) {
  std::vector<std::string> corpus = {"red fox, blue fox, red sky", "foxes and skies"};
  auto a = text::train_clip_bpe(corpus, 30);
  auto b = text::train_clip_bpe(corpus, 30);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
}

}  // namespace test_bpe_trainer
}  // namespace diffuse
