// Kimi-specific rules worked by hand from tokenization_kimi.py (pattern alternatives in
// order, _split_whitespaces_or_nonwhitespaces, the special-token table).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "chat/bpe_train.h"
#include "chat/pretokenize.h"
#include "chat/tokenizer.h"

namespace moonrun::chat {
namespace {

std::vector<std::string> pieces(const std::string& pattern, std::string_view text) {
  auto pre = Pretokenizer::compile(pattern);
  MR_CHECK(pre.is_ok()) << pre.status().to_string();
  std::vector<std::string> out;
  pre->split(text, Pretokenizer::thread_scratch(), [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

using Pieces = std::vector<std::string>;

TEST(KimiPattern, Alternatives) {
  // "Hello": upper-ish "H" then lower-ish "ello"; " World's": optional leading non-letter,
  // contraction; " " before a digit: only \s+ matches; digits in threes; Han run alone.
  EXPECT_EQ(pieces(kKimiPattern, "Hello World's 12345 中文字abc"),
            (Pieces{"Hello", " World's", " ", "123", "45", " ", "中文字", "abc"}));
  // U+3001 "、" has Script=Common (Script_Extensions include Han): it is not in a Han run.
  EXPECT_EQ(pieces(kKimiPattern, "中、文"), (Pieces{"中", "、", "文"}));
  // Newline runs, then whitespace not followed by non-space, then " x".
  EXPECT_EQ(pieces(kKimiPattern, "\n\n  x"), (Pieces{"\n\n", " ", " x"}));
  // Upper-case runs keep a trailing lower-case tail; contractions are case-insensitive.
  EXPECT_EQ(pieces(kKimiPattern, "HTTPServer WE'LL"), (Pieces{"HTTPServer", " WE'LL"}));
  // Punctuation runs take trailing newlines.
  EXPECT_EQ(pieces(kKimiPattern, "a...\n\nb"), (Pieces{"a", "...\n\n", "b"}));
}

TEST(PublicPatterns, Cl100kAndO200k) {
  // cl100k: contractions are pieces of their own; letters after one optional non-letter.
  EXPECT_EQ(pieces(kCl100kPattern, "I'm here!!\n"), (Pieces{"I", "'m", " here", "!!\n"}));
  // cl100k's `\s++$`: trailing whitespace at the very end is one piece.
  EXPECT_EQ(pieces(kCl100kPattern, "a  \n"), (Pieces{"a", "  \n"}));
  // o200k: a contraction stays with its word; '/' joins a punctuation run's tail.
  EXPECT_EQ(pieces(kO200kPattern, "I'm a/b //\n"), (Pieces{"I'm", " a", "/b", " //\n"}));
}

class SplitTest : public ::testing::Test {
 protected:
  std::unique_ptr<Tokenizer> make(size_t max_run, size_t chunk) {
    auto tokens = train_bpe_ranks(builtin_bpe_corpus(), 200, kKimiPattern);
    MR_CHECK(tokens.is_ok());
    auto ranks = RankTable::from_tokens(*tokens);
    MR_CHECK(ranks.is_ok());
    const uint32_t base = uint32_t(ranks->size());
    TokenizerOptions options;
    options.max_run_chars = max_run;
    options.chunk_chars = chunk;
    auto t = Tokenizer::create(std::move(ranks).value(), kimi_k3_default_special_tokens(base), options);
    MR_CHECK(t.is_ok());
    return std::make_unique<Tokenizer>(std::move(t).value());
  }
  static std::vector<uint32_t> concat(const Tokenizer& plain, const std::vector<std::string>& parts) {
    std::vector<uint32_t> out;
    for (const auto& p : parts) plain.encode_append(p, false, out);
    return out;
  }
};

// _split_whitespaces_or_nonwhitespaces("aaaaa bb", 2): a new slice starts where a run
// would reach 3: "aa" | "aa" | "a bb".
TEST_F(SplitTest, RunsLongerThanTheLimitAreCut) {
  auto split = make(2, 0), plain = make(0, 0);
  EXPECT_EQ(split->encode("aaaaa bb", false), concat(*plain, {"aa", "aa", "a bb"}));
  // Whitespace runs too, with U+001C counted as space (str.isspace), and characters, not
  // bytes: "é" is one character. x,' ',1C | \t,' ',y,é | t,h | e.
  const auto ids = split->encode("x \x1c\t yéthe", false);
  EXPECT_EQ(ids, concat(*plain, {"x \x1c", "\t yé", "th", "e"}));
  EXPECT_NE(ids, concat(*plain, {"x \x1c", "\t yé", "the"}));  // the last cut is visible in ids
  EXPECT_NE(ids, plain->encode("x \x1c\t yéthe", false));
}

TEST_F(SplitTest, ChunksOf400kCharactersAreEncodedApart) {
  auto chunked = make(0, 3), plain = make(0, 0);
  EXPECT_EQ(chunked->encode("abcdefg", false), concat(*plain, {"abc", "def", "g"}));
  // A special token cut by a chunk boundary is not recognised (as in the reference).
  auto chunk8 = make(0, 8);
  const auto ids = chunk8->encode("ab<|open|>", true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *chunk8->special_id("<|open|>")), 0);
}

TEST(SpecialTokens, FromTokenizerConfig) {
  const std::string config = R"({
    "added_tokens_decoder": {
      "300": {"content": "[BOS]", "special": true},
      "303": {"content": "<|im_user|>", "special": true},
      "555": {"content": "[PAD]", "special": true},
      "7":   {"content": "ignored: not a reserved id", "special": true}
    }})";
  auto specials = Tokenizer::special_tokens_from_config(config, 300, "tokenizer_config.json");
  ASSERT_TRUE(specials.is_ok()) << specials.status().to_string();
  ASSERT_EQ(specials->size(), 256u);
  EXPECT_EQ((*specials)[0].name, "[BOS]");
  EXPECT_EQ((*specials)[3].name, "<|im_user|>");
  EXPECT_EQ((*specials)[255].name, "[PAD]");
  EXPECT_EQ((*specials)[1].name, "<|reserved_token_301|>");  // unnamed: absolute id

  auto bad = Tokenizer::special_tokens_from_config(R"({"added_tokens_decoder": {"x1": {}}})", 300, "cfg.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("cfg.json"), std::string::npos);
  EXPECT_FALSE(Tokenizer::special_tokens_from_config("{not json", 300, "cfg.json").is_ok());
  // No added_tokens_decoder: the K3 defaults.
  auto defaults = Tokenizer::special_tokens_from_config("{}", 300, "cfg.json");
  ASSERT_TRUE(defaults.is_ok());
  EXPECT_EQ((*defaults)[3].name, "<|open|>");
}

TEST(Tokenizer, LoadsACheckpointDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "moonrun_tokenizer_load_test";
  std::filesystem::create_directories(dir);
  auto tokens = train_bpe_ranks(builtin_bpe_corpus(), 50, kKimiPattern);
  ASSERT_TRUE(tokens.is_ok());
  ASSERT_TRUE(write_tiktoken_model(dir / "tiktoken.model", *tokens).is_ok());
  std::filesystem::remove(dir / "tokenizer_config.json");
  auto k3 = Tokenizer::load(dir);
  ASSERT_TRUE(k3.is_ok()) << k3.status().to_string();
  EXPECT_EQ(k3->special_id("<|end_of_msg|>"), 306u + 2);
  EXPECT_EQ(k3->vocab_size(), 306u + 256);

  std::ofstream(dir / "tokenizer_config.json") << R"({"added_tokens_decoder": {"307": {"content": "<|im_end|>"}}})";
  auto k2 = Tokenizer::load(dir);
  ASSERT_TRUE(k2.is_ok()) << k2.status().to_string();
  EXPECT_EQ(k2->special_id("<|im_end|>"), 307u);
  EXPECT_FALSE(k2->special_id("<|open|>").has_value());

  auto missing = Tokenizer::load(dir / "nope");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("tiktoken.model"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moonrun::chat
