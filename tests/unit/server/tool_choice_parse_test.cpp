// Where the server hands a request's tools and tool_choice to the completion parser
// (chat_pipeline: parse_options_for -> make_chat_output_parser), on every route: with
// tool_choice "none" (vLLM's KimiK3Parser) or no tools declared (SGLang's kimik3
// detector) a call the model writes anyway is no call, whole or streamed one byte at a
// time (as SSE deltas are made), and none of its XTML reaches the content.
#include <gtest/gtest.h>

#include <string>

#include "chat/chat_request.h"
#include "chat/parse_message.h"
#include "server/chat_output.h"
#include "server/messages_request.h"
#include "server/responses_request.h"

namespace moonrun::server {
namespace {

using chat::Json;

const std::string kCompletion =
    "<|open|>response<|sep|>Checking.<|close|>response<|sep|><|open|>tools<|sep|>"
    "<|open|>call tool=\"get_time\" index=\"1\"<|sep|><|open|>argument key=\"tz\" type=\"string\"<|sep|>UTC"
    "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

// The chat body's parse options, as prepare_chat derives them (thinking off: the
// completion above starts in the reply).
chat::ParseOptions options_of(const Json& chat_body) {
  auto req = chat::parse_chat_request(chat_body);
  EXPECT_TRUE(req.is_ok()) << req.status().message();
  chat::ParseOptions o = chat::parse_options_for(*req);
  o.thinking = false;
  return o;
}

struct Parsed {
  std::string content;
  size_t calls = 0;
};

// Fed one byte at a time (each byte its own delta, as the SSE handler feeds token texts).
Parsed stream(const chat::ParseOptions& o) {
  auto parser = make_chat_output_parser(chat::ChatFormat::kKimiK3, o);
  Parsed out;
  auto add = [&out](const ParsedDelta& d) {
    out.content += d.content;
    out.calls += d.tool_calls.size();
  };
  for (char c : kCompletion) add(parser->feed(std::string_view(&c, 1)));
  add(parser->finish());
  return out;
}

void expect_no_call(const Json& chat_body, const char* route) {
  SCOPED_TRACE(route);
  const chat::ParseOptions o = options_of(chat_body);
  EXPECT_FALSE(o.tool_calls_allowed);
  const Parsed s = stream(o);
  EXPECT_EQ(s.calls, 0u);
  EXPECT_EQ(s.content, "Checking.");
  const chat::ParsedMessage whole = chat::parse_completion(chat::ChatFormat::kKimiK3, kCompletion, o);
  EXPECT_TRUE(whole.tool_calls.empty());
  EXPECT_EQ(whole.content, "Checking.");
}

void expect_call(const Json& chat_body, const char* route) {
  SCOPED_TRACE(route);
  const Parsed s = stream(options_of(chat_body));
  EXPECT_EQ(s.calls, 1u);
  EXPECT_EQ(s.content, "Checking.");
}

const char* const kMessages = R"("messages": [{"role": "user", "content": "time?"}])";

TEST(ToolChoiceReachesTheParser, ChatCompletions) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_time"}}])";
  expect_no_call(Json::parse("{" + std::string(kMessages) + ", " + tools + R"(, "tool_choice": "none"})"), "tool_choice none");
  expect_no_call(Json::parse("{" + std::string(kMessages) + "}"), "no tools");
  expect_no_call(Json::parse("{" + std::string(kMessages) + R"(, "tools": []})"), "an empty tools list");
  expect_call(Json::parse("{" + std::string(kMessages) + ", " + tools + "}"), "tools, tool_choice absent");
  expect_call(Json::parse("{" + std::string(kMessages) + ", " + tools + R"(, "tool_choice": "auto"})"), "tool_choice auto");
}

TEST(ToolChoiceReachesTheParser, AnthropicMessages) {
  const std::string tools = R"("tools": [{"name": "get_time", "input_schema": {"type": "object"}}])";
  auto none = messages_to_chat(
      Json::parse("{\"max_tokens\": 10, " + std::string(kMessages) + ", " + tools + R"(, "tool_choice": {"type": "none"}})"));
  ASSERT_TRUE(none.is_ok()) << none.status().message();
  expect_no_call(none->chat_body, "/v1/messages tool_choice none");
  auto bare = messages_to_chat(Json::parse("{\"max_tokens\": 10, " + std::string(kMessages) + "}"));
  ASSERT_TRUE(bare.is_ok()) << bare.status().message();
  expect_no_call(bare->chat_body, "/v1/messages without tools");
  auto any = messages_to_chat(
      Json::parse("{\"max_tokens\": 10, " + std::string(kMessages) + ", " + tools + R"(, "tool_choice": {"type": "auto"}})"));
  ASSERT_TRUE(any.is_ok()) << any.status().message();
  expect_call(any->chat_body, "/v1/messages tool_choice auto");
}

TEST(ToolChoiceReachesTheParser, Responses) {
  const std::string tools = R"("tools": [{"type": "function", "name": "get_time", "parameters": {"type": "object"}}])";
  auto none = responses_to_chat(Json::parse(R"({"input": "time?", )" + tools + R"(, "tool_choice": "none"})"), nullptr);
  ASSERT_TRUE(none.is_ok()) << none.status().message();
  expect_no_call(none->chat_body, "/v1/responses tool_choice none");
  auto bare = responses_to_chat(Json::parse(R"({"input": "time?"})"), nullptr);
  ASSERT_TRUE(bare.is_ok()) << bare.status().message();
  expect_no_call(bare->chat_body, "/v1/responses without tools");
  auto with = responses_to_chat(Json::parse(R"({"input": "time?", )" + tools + "}"), nullptr);
  ASSERT_TRUE(with.is_ok()) << with.status().message();
  expect_call(with->chat_body, "/v1/responses with tools");
}

}  // namespace
}  // namespace moonrun::server
