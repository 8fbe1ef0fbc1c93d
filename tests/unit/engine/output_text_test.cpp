#include "engine/output_text.h"

#include <gtest/gtest.h>

namespace moonrun {
namespace {

// A byte-level "tokenizer": token t decodes to the byte t (so "é" = 0xC3 0xA9 is two tokens
// and decoding only the first yields an unfinished UTF-8 sequence, as with real BPE).
std::string byte_decode(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t t : ids) s.push_back(static_cast<char>(t));
  return s;
}
std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST(OutputText, NeverSplitsAUtf8Character) {
  OutputText text(byte_decode, {});
  std::vector<std::string> deltas;
  for (int32_t t : bytes_of("a\xC3\xA9z")) {  // "aéz"
    EXPECT_FALSE(text.append(t));
    deltas.push_back(text.take_delta(false));
  }
  EXPECT_EQ(deltas, (std::vector<std::string>{"a", "", "\xC3\xA9", "z"}));
  EXPECT_EQ(text.text(), "a\xC3\xA9z");
}

TEST(OutputText, StopStringAcrossTokensIsCutAndNeverStreamed) {
  OutputText text(byte_decode, {"END"});
  std::string streamed;
  bool stopped = false;
  for (int32_t t : bytes_of("abcENxEND tail")) {
    stopped = text.append(t);
    streamed += text.take_delta(stopped);
    if (stopped) break;
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text.matched_stop(), "END");
  EXPECT_EQ(text.text(), "abcENx");
  EXPECT_EQ(streamed, "abcENx");  // "EN" was held back until it could not start "END"
}

// vLLM's include_stop_str_in_output: the text ends after the stop string, streamed or not.
TEST(OutputText, IncludedStopStringEndsTheText) {
  OutputText text(byte_decode, {"END"}, /*include_stop=*/true);
  std::string streamed;
  for (int32_t t : bytes_of("abcENxEND tail")) {
    const bool stopped = text.append(t);
    streamed += text.take_delta(stopped);
    if (stopped) break;
  }
  EXPECT_EQ(streamed, "abcENxEND");
  EXPECT_EQ(text.text(), "abcENxEND");
  EXPECT_EQ(text.matched_stop(), "END");
}

TEST(OutputText, EarliestStopStringWins) {
  OutputText text(byte_decode, {"cd", "bcd"});
  bool stopped = false;
  for (int32_t t : bytes_of("abcd")) stopped = text.append(t);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text.matched_stop(), "bcd");
  EXPECT_EQ(text.text(), "a");
}

TEST(OutputText, FinishFlushesTheHeldBackTail) {
  OutputText text(byte_decode, {"xyz"});
  for (int32_t t : bytes_of("abxy")) text.append(t);
  EXPECT_EQ(text.take_delta(false), "ab");
  EXPECT_EQ(text.take_delta(true), "xy");
  EXPECT_EQ(text.take_delta(true), "");
}

TEST(OutputText, WithoutADetokenizerThereIsNoText) {
  OutputText text(nullptr, {"a"});
  EXPECT_FALSE(text.append('a'));
  EXPECT_EQ(text.take_delta(true), "");
}

TEST(Utf8, IllFormedBytesBecomeReplacementCharacters) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(to_valid_utf8("a\xC3\xA9" "b"), "a\xC3\xA9" "b");  // (split: "\xA9b" would be one escape)
  EXPECT_EQ(to_valid_utf8("a\xC3z"), "a" + r + "z");          // truncated sequence
  EXPECT_EQ(to_valid_utf8("\xA9"), r);                        // lone continuation byte
  EXPECT_EQ(to_valid_utf8("\xC0\xAF"), r + r);               // overlong: C0 is never valid
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), r + r + r);       // a surrogate
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98z"), r + "z");        // maximal subpart: one U+FFFD
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(OutputText, RawBytesFromTheDetokenizerAreHandedOutAsValidUtf8) {
  OutputText text(byte_decode, {});
  for (int32_t t : {int32_t{'a'}, int32_t{0xA9}, int32_t{'b'}}) text.append(t);
  EXPECT_EQ(text.take_delta(true), "a\xEF\xBF\xBD" "b");
}

TEST(Utf8, IncompleteTail) {
  EXPECT_EQ(utf8_incomplete_tail("ab"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xC3"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("a\xC3\xA9"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98\x80"), 0u);
}

}  // namespace
}  // namespace moonrun

// The hook over the real tokenizer: byte-level ranks (token b = byte b) plus one special.
#include "server/detokenize.h"

namespace moonrun {
namespace {

TEST(DetokenizeWith, StreamsWholeCharactersAndSpecialNamesFromTheTokenizer) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  auto ranks = chat::RankTable::from_tokens(bytes);
  ASSERT_TRUE(ranks.is_ok()) << ranks.status().to_string();
  auto tok = chat::Tokenizer::create(std::move(ranks).value(), {{"<|im_end|>", 256}});
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  OutputText text(detokenize_with(std::make_shared<const chat::Tokenizer>(std::move(tok).value())), {});
  std::vector<std::string> deltas;
  for (int32_t t : {int32_t{'a'}, int32_t{0xC3}, int32_t{0xA9}, int32_t{256}, int32_t{0xC3}}) {
    text.append(t);
    deltas.push_back(text.take_delta(false));
  }
  deltas.push_back(text.take_delta(true));  // the lone 0xC3 at the end: U+FFFD
  EXPECT_EQ(deltas, (std::vector<std::string>{"a", "", "\xC3\xA9", "<|im_end|>", "", "\xEF\xBF\xBD"}));
}

}  // namespace
}  // namespace moonrun
