// Tokenizer behaviour that can be derived by hand from tiktoken's definition.
#include "chat/tokenizer.h"

#include <gtest/gtest.h>

#include "chat/bpe_train.h"

namespace moonrun::chat {
namespace {

// ranks: bytes, then the given merges in order.
RankTable make_ranks(std::vector<std::string> merges) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
  for (auto& m : merges) tokens.push_back(std::move(m));
  auto r = RankTable::from_tokens(std::move(tokens));
  MR_CHECK(r.is_ok()) << r.status().to_string();
  return std::move(r).value();
}

std::vector<uint32_t> bpe(const RankTable& ranks, std::string_view piece) {
  std::vector<uint32_t> out;
  ranks.encode_piece(piece, out);
  return out;
}

// tiktoken merges by rank over byte strings, lowest first, leftmost on ties.
TEST(RankTable, MergeOrderIsByRankThenLeftmost) {
  const RankTable ranks = make_ranks({"bc", "ab", "abc"});  // 256, 257, 258
  // "abc" is a token: the whole piece is one lookup.
  EXPECT_EQ(bpe(ranks, "abc"), (std::vector<uint32_t>{258}));
  // "abcx": bc (256) merges before ab (257): a|bc|x; then a+bc spells "abc" (258).
  EXPECT_EQ(bpe(ranks, "abcx"), (std::vector<uint32_t>{258, 'x'}));
  // "abx": only ab: ab|x. "xbca": bc then nothing: x|bc|a.
  EXPECT_EQ(bpe(ranks, "abx"), (std::vector<uint32_t>{257, 'x'}));
  EXPECT_EQ(bpe(ranks, "xbca"), (std::vector<uint32_t>{'x', 256, 'a'}));
  // "aaa" with "aa": leftmost pair merges -> aa,a.
  const RankTable aa = make_ranks({"aa"});
  EXPECT_EQ(bpe(aa, "aaa"), (std::vector<uint32_t>{256, 'a'}));
  EXPECT_EQ(bpe(aa, "aaaaa"), (std::vector<uint32_t>{256, 256, 'a'}));
}

// The heap path (pieces over 96 bytes) must give the quadratic path's result.
TEST(RankTable, LongPiecesMergeLikeShortOnes) {
  const RankTable ranks = make_ranks({"aa", "aaaa", "ab", "ba", "aab", "bab"});
  std::string text;
  for (int i = 0; i < 300; ++i) text += (i % 7 == 3 || i % 11 == 0) ? 'b' : 'a';
  // Reference: tiktoken's definition applied literally (rescan every adjacent pair, merge
  // the lowest rank, leftmost on ties).
  std::vector<std::string> parts;
  for (char c : text) parts.push_back(std::string(1, c));
  for (;;) {
    uint32_t best = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const uint32_t r = ranks.rank(parts[i] + parts[i + 1]);
      if (r < best) best = r, at = i;
    }
    if (best == kNoRank) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + at + 1);
  }
  std::vector<uint32_t> expected;
  for (auto& p : parts) expected.push_back(ranks.rank(p));
  EXPECT_EQ(bpe(ranks, text), expected);
}

TEST(RankTable, RejectsBadFiles) {
  EXPECT_FALSE(RankTable::parse("YQ== 0\nYQ== 1\n", "x.model").is_ok());  // same bytes twice
  EXPECT_FALSE(RankTable::parse("YQ== zero\n", "x.model").is_ok());
  EXPECT_FALSE(RankTable::parse("!!! 0\n", "x.model").is_ok());
  auto missing = RankTable::parse("YQ== 0\n", "x.model");  // only "a": other bytes missing
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("x.model"), std::string::npos);
}

TEST(Base64, RoundTripsAndMatchesRfc4648Vectors) {
  // RFC 4648 §10 test vectors.
  const std::pair<const char*, const char*> vectors[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},  {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    std::string decoded;
    ASSERT_TRUE(base64_decode(encoded, &decoded));
    EXPECT_EQ(decoded, plain);
  }
}

// tiktoken's public encodings leave gaps between special ids (cl100k_base: 100257..100260,
// then 100276): ids in a gap are not tokens.
TEST(Tokenizer, SpecialIdGapsAreNotTokens) {
  auto t = Tokenizer::create(make_ranks({}), {{"<|a|>", 300}, {"<|b|>", 310}}, TokenizerOptions{kCl100kPattern, 0, 0});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_TRUE(t->is_special(300));
  EXPECT_TRUE(t->is_special(310));
  EXPECT_FALSE(t->is_special(305));
  EXPECT_FALSE(t->is_valid_id(305));
  EXPECT_FALSE(t->is_valid_id(256));  // between the ranks and the first special id
  EXPECT_EQ(t->vocab_size(), 311u);
  EXPECT_EQ(t->encode("x<|b|>", true), (std::vector<uint32_t>{'x', 310}));
}

class KimiTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokens = train_bpe_ranks(builtin_bpe_corpus(), 400, kKimiPattern);
    ASSERT_TRUE(tokens.is_ok());
    auto ranks = RankTable::from_tokens(*tokens);
    ASSERT_TRUE(ranks.is_ok());
    const uint32_t base = uint32_t(ranks->size());
    auto t = Tokenizer::create(std::move(ranks).value(), kimi_k3_default_special_tokens(base));
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    tok = std::make_unique<Tokenizer>(std::move(t).value());
  }
  std::unique_ptr<Tokenizer> tok;
};

TEST_F(KimiTokenizerTest, SpecialTokensOnlyWhereAllowed) {
  const uint32_t base = tok->num_base_tokens();
  EXPECT_EQ(tok->special_id("<|open|>"), base + 3);
  EXPECT_EQ(tok->special_id("[BOS]"), base);
  EXPECT_EQ(tok->special_id("<|media_pad|>"), base + 21);
  EXPECT_EQ(tok->special_id("[PAD]"), base + 255);
  EXPECT_EQ(tok->special_id("<|reserved_token_" + std::to_string(base + 7) + "|>"), base + 7);
  EXPECT_EQ(tok->vocab_size(), base + 256);

  const auto marker = tok->encode("<|open|>", true);
  EXPECT_EQ(marker, (std::vector<uint32_t>{base + 3}));
  const auto plain = tok->encode("<|open|>", false);
  EXPECT_GT(plain.size(), 1u);
  for (uint32_t id : plain) EXPECT_LT(id, base);
  EXPECT_EQ(tok->decode(plain), "<|open|>");

  std::vector<Segment> segments = {{"<|open|>message<|sep|>", true}, {"hi <|close|>", false}};
  const auto ids = tok->encode(segments);
  EXPECT_EQ(ids.front(), base + 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), base + 4), 0);  // user's <|close|> stays text
  EXPECT_EQ(tok->decode(ids), "<|open|>message<|sep|>hi <|close|>");
}

TEST_F(KimiTokenizerTest, IllFormedBytesRoundTrip) {
  const std::string text = "ok \xff\xfe tail \xe4\xbd end \xed\xa0\x80.";
  const auto ids = tok->encode(text, false);
  EXPECT_EQ(tok->decode(ids), text);
}

}  // namespace
}  // namespace moonrun::chat
