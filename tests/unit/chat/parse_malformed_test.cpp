// Malformed and truncated model output: never a crash, never lost text. Expected values are
// derived by hand from the format (see parse_k3.h / parse_k2.h).
#include <gtest/gtest.h>

#include "chat/parse_message.h"

namespace moonrun::chat {
namespace {

ParsedMessage k3(const std::string& text, bool thinking = true) {
  ParseOptions o;
  o.thinking = thinking;
  o.id_seed = 1;
  return parse_completion(ChatFormat::kKimiK3, text, o);
}
ParsedMessage k2(const std::string& text, bool thinking = true) {
  ParseOptions o;
  o.thinking = thinking;
  return parse_completion(ChatFormat::kKimiK2, text, o);
}

const std::string kThinkEnd = "<|close|>think<|sep|>";
const std::string kResp = "<|open|>response<|sep|>";
const std::string kRespEnd = "<|close|>response<|sep|>";
const std::string kTools = "<|open|>tools<|sep|>";
const std::string kToolsEnd = "<|close|>tools<|sep|>";
const std::string kMsgEnd = "<|close|>message<|sep|><|end_of_msg|>";

std::string arg(const std::string& key, const std::string& type, const std::string& value) {
  return "<|open|>argument key=\"" + key + "\" type=\"" + type + "\"<|sep|>" + value + "<|close|>argument<|sep|>";
}

TEST(ParseK3Malformed, TruncatedInsideThinking) {
  auto m = k3("I am still thinking about <|open|>resp");
  EXPECT_EQ(m.reasoning, "I am still thinking about <|open|>resp");
  EXPECT_EQ(m.content, "");
}

TEST(ParseK3Malformed, TruncatedInsideResponseHoldsPartialMarkerUntilFinish) {
  const std::string text = "r" + kThinkEnd + kResp + "Hello<|clo";
  auto parser = make_completion_parser(ChatFormat::kKimiK3, {});
  ParseDelta d = parser->feed(text);
  EXPECT_EQ(d.reasoning, "r");
  EXPECT_EQ(d.content, "Hello");  // "<|clo" may still be <|close|>: held back
  ParseDelta f = parser->finish();
  EXPECT_EQ(f.content, "<|clo");   // the stream ended: it was text after all
}

TEST(ParseK3Malformed, SplitMarkersNeverReachContent) {
  const std::string text = "r" + kThinkEnd + kResp + "Hi" + kRespEnd + kMsgEnd;
  auto parser = make_completion_parser(ChatFormat::kKimiK3, {});
  std::string content;
  for (char c : text) {
    ParseDelta d = parser->feed(std::string(1, c));
    EXPECT_EQ(d.content.find('<'), std::string::npos) << d.content;
    content += d.content;
  }
  content += parser->finish().content;
  EXPECT_EQ(content, "Hi");
}

TEST(ParseK3Malformed, UnclosedCallGoesToContentVerbatim) {
  const std::string call = "<|open|>call tool=\"f\" index=\"1\"<|sep|>" + arg("a", "string", "x") + "<|open|>argument key=\"b\"";
  auto m = k3("r" + kThinkEnd + kResp + "ok" + kRespEnd + kTools + call);
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, "ok" + call);
}

TEST(ParseK3Malformed, CallCutByEndOfMessage) {
  const std::string call = "<|open|>call tool=\"f\" index=\"1\"<|sep|>" + arg("a", "string", "x");
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + call + kToolsEnd + kMsgEnd);
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, call);
}

TEST(ParseK3Malformed, BadJsonInTypedArgumentKeepsTheText) {
  const std::string call = "<|open|>call tool=\"f\" index=\"1\"<|sep|>" + arg("n", "number", "12abc") +
                           arg("o", "object", "{\"a\": 1") + arg("t", "boolean", "true") + "<|close|>call<|sep|>";
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + call + kToolsEnd + kMsgEnd);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"n\": \"12abc\", \"o\": \"{\\\"a\\\": 1\", \"t\": true}");
}

TEST(ParseK3Malformed, UnknownAttributesAndTypes) {
  const std::string call = "<|open|>call tool=\"f\" index=\"1\" strict=\"yes\" junk<|sep|>" +
                           std::string("<|open|>argument key=\"k\" type=\"integer\" extra=\"1\"<|sep|>5<|close|>argument<|sep|>") +
                           "<|open|>argument key=\"s\"<|sep|>no type<|close|>argument<|sep|><|close|>call<|sep|>";
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + call + kToolsEnd + kMsgEnd);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"k\": 5, \"s\": \"no type\"}");
}

TEST(ParseK3Malformed, CallWithoutToolNameIsContent) {
  const std::string call = "<|open|>call index=\"1\"<|sep|>" + arg("a", "string", "x") + "<|close|>call<|sep|>";
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + call + kToolsEnd + kMsgEnd);
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, call);
}

TEST(ParseK3Malformed, TextAfterEndMarkerIsContent) {
  auto m = k3("r" + kThinkEnd + kResp + "a" + kRespEnd + kMsgEnd + "trailing text");
  EXPECT_EQ(m.content, "atrailing text");
}

TEST(ParseK3Malformed, MarkersInsideStringArgumentStayInTheValue) {
  const std::string value = "x <|open|>foo<|sep|> <|sep|> <|close|>call y";
  const std::string call = "<|open|>call tool=\"a&amp;b&quot;c\" index=\"1\"<|sep|>" + arg("v", "string", value) + "<|close|>call<|sep|>";
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + call + kToolsEnd + kMsgEnd);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "a&b\"c");
  EXPECT_EQ(Json::parse(m.tool_calls[0].arguments)["v"], value);
}

TEST(ParseK3Malformed, StrayMarkersAndTagsAreText) {
  auto m = k3("a<|sep|>b" + kThinkEnd + kResp + "c<|sep|>d<|open|>foo<|sep|>e<|close|>bar<|sep|>" + kRespEnd + kMsgEnd);
  EXPECT_EQ(m.reasoning, "a<|sep|>b");
  EXPECT_EQ(m.content, "c<|sep|>d<|open|>foo<|sep|>e<|close|>bar<|sep|>");
}

TEST(ParseK3Malformed, ThinkChannelSkippedOrRepeated) {
  auto skipped = k3(kResp + "direct" + kRespEnd + kMsgEnd);
  EXPECT_EQ(skipped.reasoning, "");
  EXPECT_EQ(skipped.content, "direct");
  auto repeated = k3("<|open|>think<|sep|>why" + kThinkEnd + kResp + "so" + kRespEnd + kMsgEnd);
  EXPECT_EQ(repeated.reasoning, "why");
  EXPECT_EQ(repeated.content, "so");
}

TEST(ParseK3Malformed, ResponseNeverClosedBeforeTools) {
  const std::string call = "<|open|>call tool=\"f\" index=\"1\"<|sep|><|close|>call<|sep|>";
  auto m = k3("r" + kThinkEnd + kResp + "text" + kTools + call + kToolsEnd + kMsgEnd);
  EXPECT_EQ(m.content, "text");
  EXPECT_EQ(m.tool_calls.size(), 1u);
}

TEST(ParseK3Malformed, NoThinkingModeStartsInResponse) {
  auto m = k3("plain answer" + kRespEnd + kMsgEnd, /*thinking=*/false);
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "plain answer");
  // Without any markers every byte is content, invalid UTF-8 included.
  const std::string junk = std::string("\xff\xfe<|\x80 <|open|", 16);
  EXPECT_EQ(k3(junk, false).content, junk);
  EXPECT_EQ(k3(junk, true).reasoning, junk);
}

TEST(ParseK3Malformed, OverlongTagHeaderIsReleasedAsText) {
  const std::string body(5000, 'x');
  auto m = k3("r" + kThinkEnd + kResp + "<|open|>" + body + kRespEnd + kMsgEnd);
  EXPECT_EQ(m.content, "<|open|>" + body);
}

TEST(ParseK2Malformed, Shapes) {
  auto m = k2("<think>why</think>Answer.<|im_end|>");
  EXPECT_EQ(m.reasoning, "why");
  EXPECT_EQ(m.content, "Answer.");

  m = k2("still thinking <think> x");  // never closed: all reasoning, the inner <think> kept
  EXPECT_EQ(m.reasoning, "still thinking <think> x");

  m = k2("<think>r</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
         "<|tool_call_argument_begin|>{\"city\": \"Tokyo\"}<|tool_call_end|><|tool_call_begin|> functions.f.g:12 "
         "<|tool_call_argument_begin|> <|tool_call_end|><|tool_calls_section_end|><|im_end|>");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"city\": \"Tokyo\"}");
  EXPECT_EQ(m.tool_calls[1].id, "functions.f.g:12");
  EXPECT_EQ(m.tool_calls[1].name, "f.g");
  EXPECT_EQ(m.tool_calls[1].arguments, "{}");
  EXPECT_EQ(m.content, "");

  // Unclosed call: its text is content. Text after <|im_end|> is content.
  m = k2("<think>r</think>hi<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\"");
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, "hi<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\"");
  m = k2("<think>r</think>done<|im_end|>extra", true);
  EXPECT_EQ(m.content, "doneextra");

  // White space alone before the tool section is layout; no thinking starts in content.
  m = k2("\n\n<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}"
         "<|tool_call_end|><|tool_calls_section_end|><|im_end|>", false);
  EXPECT_EQ(m.content, "");
  EXPECT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(k2("  just text  ", false).content, "  just text  ");
}

// Inputs the fuzzers found where the cut points once changed the result (stray white space
// at the end, text between arguments).
TEST(ParseMalformed, ChunkingNeverChangesTheResult) {
  const std::vector<std::pair<ChatFormat, std::string>> cases = {
      {ChatFormat::kKimiK3, std::string("\x03r<\x00\x00\x00\x05|alose|>think<|se<|sep|>hi<|close|>r>tesponse<'<|close|>"
                                        "response<|sep|><|open|>tools<|sep|><|open|>call toolp|>ii<|clowe|>response<ep|>"
                                        "<|open|>response<|sep|>ii<|clowe|>response<|sep|><|o>onpt|eols<|sep|><|oy=\"apen|>c\" tall ", 196)},
      {ChatFormat::kKimiK2, "<|tool_calls_section_begin|>ls\xff;e<think>r</thin<|to\xeel_call_e\t\t<|i\t\t\tn\t"},
      {ChatFormat::kKimiK3, "r<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|> x \n<|open|>argument key=\"a\"<|sep|>1"
                            "<|close|>argument<|sep|>\n y\t<|close|>call<|sep|> z \n"},
  };
  for (const auto& [format, text] : cases) {
    for (bool thinking : {false, true}) {
      ParseOptions o;
      o.thinking = thinking;
      o.id_seed = 5;
      const Json whole = parse_completion(format, text, o).to_json();
      for (size_t chunk = 1; chunk <= 17; ++chunk) {
        auto parser = make_completion_parser(format, o);
        ParsedMessage m;
        for (size_t at = 0; at < text.size(); at += chunk) m.append(parser->feed(std::string_view(text).substr(at, chunk)));
        m.append(parser->finish());
        EXPECT_EQ(m.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  whole.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
            << "chunk " << chunk;
      }
    }
  }
  // Text between arguments is kept, trimmed, after the call; stray text after it too.
  ParseOptions o;
  const ParsedMessage m = parse_completion(ChatFormat::kKimiK3, cases[2].second, o);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": \"1\"}");
  EXPECT_EQ(m.content, "x \n\n y z");  // " x \n" + "\n y\t" inside the call, " z \n" after it
}

}  // namespace
}  // namespace moonrun::chat
