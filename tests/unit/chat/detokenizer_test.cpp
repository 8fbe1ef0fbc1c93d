// Streaming detokenization against whole-text decoding with U+FFFD replacement (the Unicode
// Standard's "maximal subpart" practice, which Python's errors="replace" follows).
#include "chat/detokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "chat/tokenizer_utf8.h"

namespace moonrun::chat {
namespace {

bool is_well_formed(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(p + i, s.size() - i);
    if (!len) return false;
    i += len;
  }
  return true;
}

// The Unicode Standard 15.0, §3.9, Table 3-8 ("Use of U+FFFD in UTF-8 Conversion"): the bytes
// 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 decode as a FFFD FFFD FFFD b FFFD c FFFD FFFD d.
TEST(Utf8, MaximalSubpartReplacementMatchesTheStandard) {
  const std::string bytes = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  EXPECT_EQ(utf8_replace_invalid(bytes), "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd");
  // Surrogates and overlongs are ill-formed byte by byte (Table 3-7: ED A0 is not a
  // valid start, C0 is never valid).
  EXPECT_EQ(utf8_replace_invalid("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8_replace_invalid("\xC0\xAF"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8_replace_invalid("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8_replace_invalid("\xF0\x9F\x98\x80"), "\U0001F600");
}

TEST(Utf8, PythonIsspace) {
  // str.isspace() is true for U+001C..U+001F (bidi class B/S) and false for U+200B.
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Du, 0x1Cu, 0x1Fu, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u, 0x3000u}) {
    EXPECT_TRUE(python_isspace(cp)) << cp;
  }
  for (uint32_t cp : {0x08u, 0x1Bu, 0x21u, 0x180Eu, 0x200Bu, 0xFEFFu, 0x3001u}) EXPECT_FALSE(python_isspace(cp)) << cp;
}

class DetokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A vocabulary whose tokens cut characters apart: bytes, plus partial sequences.
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
    for (const char* t : {"\xE4\xBD", "\xA0\xE5", "\xF0\x9F", "\x98\x80", "he", "llo", " \xE2\x82", "\xAC!", "\xE4\xBD\xA0"}) {
      tokens.push_back(t);
    }
    auto ranks = RankTable::from_tokens(tokens);
    ASSERT_TRUE(ranks.is_ok());
    const uint32_t base = uint32_t(ranks->size());
    auto t = Tokenizer::create(std::move(ranks).value(), kimi_k3_default_special_tokens(base));
    ASSERT_TRUE(t.is_ok());
    tok = std::make_unique<Tokenizer>(std::move(t).value());
  }
  std::unique_ptr<Tokenizer> tok;
};

TEST_F(DetokenizerTest, HoldsBackIncompleteCharacters) {
  Detokenizer d(*tok);
  // "你" = E4 BD A0, "好" = E5 A5 BD: tokens E4BD | A0E5 | A5 | BD.
  EXPECT_EQ(d.push(256), "");
  EXPECT_EQ(d.pending_bytes(), 2u);
  EXPECT_EQ(d.push(257), "\xE4\xBD\xA0");
  EXPECT_EQ(d.push(0xA5), "");
  EXPECT_EQ(d.push(0xBD), "\xE5\xA5\xBD");
  EXPECT_EQ(d.flush(), "");
}

TEST_F(DetokenizerTest, IllFormedBytesBecomeReplacementCharacters) {
  Detokenizer d(*tok);
  EXPECT_EQ(d.push(256), "");                    // E4 BD: could still complete
  EXPECT_EQ(d.push('x'), "\uFFFDx");            // it did not: one U+FFFD for the subpart
  EXPECT_EQ(d.push(0xFF), "\uFFFD");             // never valid: emitted at once
  EXPECT_EQ(d.push(258), "");                    // F0 9F
  EXPECT_EQ(d.flush(), "\uFFFD");                // the stream ended inside a character
}

TEST_F(DetokenizerTest, SpecialTokens) {
  const uint32_t open = *tok->special_id("<|open|>");
  Detokenizer keep(*tok);
  EXPECT_EQ(keep.push(open), "<|open|>");
  Detokenizer skip(*tok, /*skip_special=*/true);
  EXPECT_EQ(skip.push(256), "");
  EXPECT_EQ(skip.push(open), "");
  EXPECT_EQ(skip.push(0xA0), "\xE4\xBD\xA0");  // the skipped token does not break the character
}

// Random id streams: every step is well-formed, and the stream equals whole-text decoding.
TEST_F(DetokenizerTest, StreamEqualsWholeDecode) {
  std::mt19937 rng(1234);
  const uint32_t n_tokens = tok->num_base_tokens();
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint32_t> ids;
    const int len = 1 + int(rng() % 40);
    for (int i = 0; i < len; ++i) {
      const uint32_t r = rng() % 4;
      ids.push_back(r == 0 ? 0x80 + rng() % 0x80 : r == 1 ? 256 + rng() % (n_tokens - 256) : r == 2 ? 0xC0 + rng() % 0x40 : 'a' + rng() % 26);
    }
    Detokenizer d(*tok);
    std::string streamed;
    for (uint32_t id : ids) {
      const std::string piece = d.push(id);
      ASSERT_TRUE(is_well_formed(piece));
      streamed += piece;
    }
    const std::string tail = d.flush();
    ASSERT_TRUE(is_well_formed(tail));
    streamed += tail;
    EXPECT_EQ(streamed, tok->decode_text(ids));
  }
}

}  // namespace
}  // namespace moonrun::chat
