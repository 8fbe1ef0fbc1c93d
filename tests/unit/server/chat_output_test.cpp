// The server's view of a parsed completion: which tokens count as reasoning. The handler
// asks in_reasoning() before feeding each token's text, so a token counts as reasoning
// when the parser was in the think channel as it arrived.
#include "server/chat_output.h"

#include <gtest/gtest.h>

namespace moonrun::server {
namespace {

// Feeds `pieces` one by one; returns how many were fed while in_reasoning() held, and the
// message they parse to.
int reasoning_pieces(chat::ParseOptions o, const std::vector<std::string>& pieces, ParsedDelta& all) {
  auto parser = make_chat_output_parser(chat::ChatFormat::kKimiK3, o);
  int n = 0;
  auto add = [&all](ParsedDelta d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (auto& c : d.tool_calls) all.tool_calls.push_back(std::move(c));
  };
  for (const auto& p : pieces) {
    n += parser->in_reasoning();
    add(parser->feed(p));
  }
  add(parser->finish());
  return n;
}

TEST(ChatOutput, ThinkingGenerationCountsUpToTheReply) {
  chat::ParseOptions o;
  o.thinking = true;
  ParsedDelta m;
  // Every piece up to and with the one that gives the first content.
  EXPECT_EQ(reasoning_pieces(o, {"a", "b", "<|close|>", "think", "<|sep|>", "<|open|>", "response", "<|sep|>", "hi"}, m), 9);
  EXPECT_EQ(m.reasoning, "ab");
  EXPECT_EQ(m.content, "hi");
}

// Thinking off, the model opening its own think channel (SGLang's in-band open marker):
// its text is reasoning, and so are its tokens from the first reasoning on.
TEST(ChatOutput, ThinkChannelOpenedInBandCountsAsReasoning) {
  chat::ParseOptions o;
  o.thinking = false;
  ParsedDelta m;
  const int n = reasoning_pieces(
      o, {"<|open|>", "think", "<|sep|>", "a", "b", "<|close|>", "think", "<|sep|>", "<|open|>", "response", "<|sep|>", "x"}, m);
  EXPECT_EQ(m.reasoning, "ab");
  EXPECT_EQ(m.content, "x");
  EXPECT_EQ(n, 8);  // "b" through "x": from the first reasoning to the first content
}

TEST(ChatOutput, NoReasoningAfterTheReplyBegan) {
  chat::ParseOptions o;
  o.thinking = false;
  ParsedDelta m;
  EXPECT_EQ(reasoning_pieces(o, {"x", "<|open|>", "think", "<|sep|>", "q", "<|close|>", "think", "<|sep|>", "y"}, m), 0);
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "xy");  // a think channel quoted inside the reply is dropped
}

}  // namespace
}  // namespace moonrun::server
