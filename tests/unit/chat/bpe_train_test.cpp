// The trainer against hand-worked byte-pair encoding.
#include "chat/bpe_train.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "chat/pretokenize.h"
#include "chat/tokenizer.h"
#include "chat/tokenizer_ranks.h"

namespace moonrun::chat {
namespace {

// The textbook example (Gage 1994; Wikipedia "Byte pair encoding"): in "aaabdaaabac" the
// pair "aa" is most frequent (4 adjacent occurrences), then "ab" (twice, tied with
// ("aa","a") but (97,98) < (256,97)), then ("aa","ab") ("aaab" twice); no pair repeats after.
TEST(BpeTrain, TextbookExample) {
  auto tokens = train_bpe_ranks("aaabdaaabac", 10, R"([\s\S]+)");
  ASSERT_TRUE(tokens.is_ok()) << tokens.status().to_string();
  ASSERT_EQ(tokens->size(), 259u);
  EXPECT_EQ((*tokens)[256], "aa");
  EXPECT_EQ((*tokens)[257], "ab");
  EXPECT_EQ((*tokens)[258], "aaab");
  for (int b = 0; b < 256; ++b) EXPECT_EQ((*tokens)[b], std::string(1, char(b)));
}

// Pieces are words: no merge spans a pre-tokenisation boundary (" a" and "a" are pieces of
// "a a a a", so the only repeated pair is (" ", "a")).
TEST(BpeTrain, MergesStayInsidePieces) {
  auto tokens = train_bpe_ranks("a a a a", 10, kKimiPattern);
  ASSERT_TRUE(tokens.is_ok());
  ASSERT_EQ(tokens->size(), 257u);
  EXPECT_EQ((*tokens)[256], " a");
}

TEST(BpeTrain, DeterministicAndLoadable) {
  auto a = train_bpe_ranks(builtin_bpe_corpus(), 300, kKimiPattern);
  auto b = train_bpe_ranks(builtin_bpe_corpus(), 300, kKimiPattern);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(a->size(), 556u);
  // Asking for more merges than the corpus supports stops when no pair repeats.
  auto all = train_bpe_ranks(builtin_bpe_corpus(), 100000, kKimiPattern);
  ASSERT_TRUE(all.is_ok());
  EXPECT_LT(all->size(), 256u + 100000u);
  // The demo model (cmd_make_demo_model) uses 1024 base tokens: 768 merges must exist.
  EXPECT_GE(all->size(), 1024u);

  const auto path = std::filesystem::temp_directory_path() / "moonrun_bpe_train_test.model";
  ASSERT_TRUE(write_tiktoken_model(path, *a).is_ok());
  auto ranks = RankTable::load(path);
  ASSERT_TRUE(ranks.is_ok()) << ranks.status().to_string();
  ASSERT_EQ(ranks->size(), a->size());
  for (uint32_t r = 0; r < a->size(); ++r) EXPECT_EQ(ranks->bytes(r), (*a)[r]);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace moonrun::chat
