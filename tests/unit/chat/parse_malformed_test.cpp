// Malformed and truncated model output: never a crash, never a control marker in
// reasoning or content, the same result whole or streamed. The shapes are the ones issue
// 14 lists (a call cut by max_tokens, a call without its close, half-written markers,
// text before <think>, stray text between markers, calls that name no function); what
// each gives follows the peers' parsers (vLLM kimi_k2 / kimi_k3, SGLang kimik2 / kimik3):
// markup is dropped, the text of the channels is kept (K3 markers the text quotes, no tags
// where they stand, with it: k3_quoting).
#include <gtest/gtest.h>

#include "chat/chat_request.h"
#include "chat/parse_message.h"

namespace moonrun::chat {
namespace {

ParseOptions opts(bool thinking = true) {
  ParseOptions o;
  o.thinking = thinking;
  o.id_seed = 1;
  return o;
}

const char* const kMarkers[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<|tool_calls_section_begin|>",
                                "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
                                "<|tool_call_argument_begin|>", "<|im_end|>", "<think>", "</think>"};

// Parses whole and in every chunk size 1..8, checks they agree and that no marker leaks
// (unless the text quotes markers: `quoting`).
ParsedMessage parse(ChatFormat f, const std::string& text, const ParseOptions& o, bool quoting = false) {
  const ParsedMessage whole = parse_completion(f, text, o);
  for (size_t chunk = 1; chunk <= 8; ++chunk) {
    auto parser = make_completion_parser(f, o);
    ParsedMessage m;
    for (size_t at = 0; at < text.size(); at += chunk) m.append(parser->feed(std::string_view(text).substr(at, chunk)));
    m.append(parser->finish());
    EXPECT_EQ(m.to_json(), whole.to_json()) << "chunk " << chunk << " of " << text;
  }
  if (quoting) return whole;
  for (const char* mk : kMarkers) {
    EXPECT_EQ(whole.reasoning.find(mk), std::string::npos) << mk << " leaked into reasoning of " << text;
    EXPECT_EQ(whole.content.find(mk), std::string::npos) << mk << " leaked into content of " << text;
  }
  // Nor does the start of one, cut off by the end of the stream.
  for (const std::string* out : {&whole.reasoning, &whole.content})
    EXPECT_FALSE(out->size() >= 2 && out->compare(out->size() - 2, 2, "<|") == 0) << "a cut marker ends " << *out;
  return whole;
}
ParsedMessage k3(const std::string& text, bool thinking = true) { return parse(ChatFormat::kKimiK3, text, opts(thinking)); }
ParsedMessage k3_quoting(const std::string& text, bool thinking = true) {
  return parse(ChatFormat::kKimiK3, text, opts(thinking), /*quoting=*/true);
}
ParsedMessage k2(const std::string& text, bool thinking = true) { return parse(ChatFormat::kKimiK2, text, opts(thinking)); }

const std::string kThinkEnd = "<|close|>think<|sep|>";
const std::string kResp = "<|open|>response<|sep|>";
const std::string kRespEnd = "<|close|>response<|sep|>";
const std::string kTools = "<|open|>tools<|sep|>";
const std::string kToolsEnd = "<|close|>tools<|sep|>";
const std::string kMsgEnd = "<|close|>message<|sep|><|end_of_msg|>";

std::string arg(const std::string& key, const std::string& type, const std::string& value) {
  return "<|open|>argument key=\"" + key + "\" type=\"" + type + "\"<|sep|>" + value + "<|close|>argument<|sep|>";
}
std::string call(const std::string& name, const std::string& args) {
  return "<|open|>call tool=\"" + name + "\" index=\"1\"<|sep|>" + args + "<|close|>call<|sep|>";
}

TEST(ParseK3Malformed, HalfWrittenTagAtTheEndOfAStream) {
  // max_tokens stopped the model inside a tag: SGLang strips the partial marker suffix.
  EXPECT_EQ(k3("I am still thinking about <|open|>resp").reasoning, "I am still thinking about ");
  EXPECT_EQ(k3("r" + kThinkEnd + kResp + "Hello<|open|>tool").content, "Hello");
  EXPECT_EQ(k3("r" + kThinkEnd + kResp + "Hello<|").content, "Hello");
  EXPECT_EQ(k3("r" + kThinkEnd + kResp + "Hello<|clo").content, "Hello");
  EXPECT_EQ(k3("r" + kThinkEnd + kResp + "a < b").content, "a < b");  // "<" alone is text
}

TEST(ParseK3Malformed, PartialMarkerHeldBackWhileStreaming) {
  auto parser = make_completion_parser(ChatFormat::kKimiK3, {});
  ParseDelta d = parser->feed("r" + kThinkEnd + kResp + "Hello<|clo");
  EXPECT_EQ(d.content, "Hello");  // "<|clo" may still become <|close|>: held back
  EXPECT_EQ(parser->feed("se|>response<|sep|>").content, "");
  EXPECT_EQ(parser->finish().content, "");
}

TEST(ParseK3Malformed, CallCutByMaxTokensIsDropped) {
  // vLLM's call regex needs <|close|>call<|sep|>: an unfinished call is no call, and its
  // markup is not content either.
  const std::string cut = "<|open|>call tool=\"f\" index=\"1\"<|sep|>" + arg("a", "string", "x") + "<|open|>argument key=\"b\"";
  auto m = k3("r" + kThinkEnd + kResp + "ok" + kRespEnd + kTools + cut);
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, "ok");
}

TEST(ParseK3Malformed, CallWithoutItsCloseIsDropped) {
  const std::string open_call = "<|open|>call tool=\"f\" index=\"1\"<|sep|>" + arg("a", "string", "x");
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + open_call + kToolsEnd + kMsgEnd);
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, "");
  // A new call before the old one closed: the old one is dropped, the new one counts.
  m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + open_call + call("g", arg("k", "number", "1")) + kToolsEnd + kMsgEnd);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "g");
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"k\": 1}");
}

TEST(ParseK3Malformed, CallWithoutToolNameIsDropped) {
  auto m = k3("r" + kThinkEnd + kResp + "x" + kRespEnd + kTools + "<|open|>call index=\"1\"<|sep|>" + arg("a", "string", "x") +
              "<|close|>call<|sep|>" + kToolsEnd + kMsgEnd);
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, "x");
}

TEST(ParseK3Malformed, BadJsonInTypedArgumentKeepsTheText) {
  const std::string c = call("f", arg("n", "number", "12abc") + arg("o", "object", "{\"a\": 1") + arg("t", "boolean", "true"));
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + c + kToolsEnd + kMsgEnd);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"n\": \"12abc\", \"o\": \"{\\\"a\\\": 1\", \"t\": true}");
}

TEST(ParseK3Malformed, BigIntegersAndNanSurviveAsPythonWritesThem) {
  // vLLM: json.loads then json.dumps: exact big integers, NaN/Infinity kept, floats repr'd.
  const std::string c = call("f", arg("big", "number", "123456789012345678901234567890") + arg("nan", "number", "NaN") +
                                      arg("inf", "number", "-Infinity") + arg("f", "number", "1E5") +
                                      arg("o", "object", "{\"x\": [1.50, -0, 99999999999999999999]}"));
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + c + kToolsEnd + kMsgEnd);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments,
            "{\"big\": 123456789012345678901234567890, \"nan\": NaN, \"inf\": -Infinity, \"f\": 100000.0, "
            "\"o\": {\"x\": [1.5, 0, 99999999999999999999]}}");
}

TEST(ParseK3Malformed, UnknownAttributesAndTypes) {
  const std::string c = "<|open|>call tool=\"f\" index=\"1\" strict=\"yes\" junk<|sep|>" +
                        std::string("<|open|>argument key=\"k\" type=\"integer\" extra=\"1\"<|sep|>5<|close|>argument<|sep|>") +
                        "<|open|>argument key=\"s\"<|sep|>no type<|close|>argument<|sep|><|close|>call<|sep|>";
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + c + kToolsEnd + kMsgEnd);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"k\": 5, \"s\": \"no type\"}");
}

TEST(ParseK3Malformed, MarkersInsideStringArgumentStayInTheValue) {
  const std::string value = "x <|open|>foo<|sep|> <|sep|> <|close|>call y";
  auto m = k3("r" + kThinkEnd + kResp + kRespEnd + kTools + "<|open|>call tool=\"a&amp;b&quot;c\" index=\"1\"<|sep|>" +
              arg("v", "string", value) + "<|close|>call<|sep|>" + kToolsEnd + kMsgEnd);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "a&b\"c");
  EXPECT_EQ(Json::parse(m.tool_calls[0].arguments)["v"], value);
}

TEST(ParseK3Malformed, StrayMarkersAreKeptVerbatim) {
  // vLLM's kimi_k3 parsers: the think channel's text and the response channel's body as
  // generated, so a marker that is no tag where it stands stays, spelling and all.
  auto m = k3_quoting("a<|sep|>b" + kThinkEnd + kResp + "c<|sep|>d<|open|>foo<|sep|>e<|close|>bar<|sep|>" + kRespEnd + kMsgEnd);
  EXPECT_EQ(m.reasoning, "a<|sep|>b");
  EXPECT_EQ(m.content, "c<|sep|>d<|open|>foo<|sep|>e<|close|>bar<|sep|>");
  const std::string quoted_arg = "a<|open|>argument key=\"k\" type=\"string\"<|sep|>b<|close|>argument<|sep|>c";
  m = k3_quoting("r" + kThinkEnd + kResp + quoted_arg + kRespEnd);
  EXPECT_EQ(m.content, quoted_arg);
}

TEST(ParseK3Malformed, TextOutsideTheResponseChannel) {
  // vLLM's content is the response channel's body when there is one: text between the
  // channels, between calls, after the tools and after the message is dropped.
  auto m = k3("r" + kThinkEnd + " junk " + kResp + "answer" + kRespEnd + " more " + kTools + " x " +
              call("f", "") + " y " + kToolsEnd + " z " + kMsgEnd + "after");
  EXPECT_EQ(m.content, "answer");
  EXPECT_EQ(m.tool_calls.size(), 1u);
  // Without a response channel the text after the think channel is the content (vLLM's
  // _strip_response_content of the text before the tools).
  m = k3("r" + kThinkEnd + "plain answer" + kTools + call("f", "") + kToolsEnd + kMsgEnd);
  EXPECT_EQ(m.content, "plain answer");
  EXPECT_EQ(m.tool_calls.size(), 1u);
}

TEST(ParseK3Malformed, ThinkChannelSkippedOrRepeated) {
  auto skipped = k3(kResp + "direct" + kRespEnd + kMsgEnd);
  EXPECT_EQ(skipped.reasoning, "");
  EXPECT_EQ(skipped.content, "direct");
  auto repeated = k3("<|open|>think<|sep|>why" + kThinkEnd + kResp + "so" + kRespEnd + kMsgEnd);
  EXPECT_EQ(repeated.reasoning, "why");
  EXPECT_EQ(repeated.content, "so");
  // Layout before the repeated opener is not reasoning.
  auto after_newline = k3("\n<|open|>think<|sep|>why" + kThinkEnd + kResp + "so" + kRespEnd + kMsgEnd);
  EXPECT_EQ(after_newline.reasoning, "why");
}

TEST(ParseK3Malformed, ChannelTagEndsAnUnclosedThinkChannel) {
  auto m = k3("why" + kResp + "so" + kRespEnd + kMsgEnd);
  EXPECT_EQ(m.reasoning, "why");
  EXPECT_EQ(m.content, "so");
}

TEST(ParseK3Malformed, ResponseNeverClosedBeforeTools) {
  auto m = k3("r" + kThinkEnd + kResp + "text" + kTools + call("f", "") + kToolsEnd + kMsgEnd);
  EXPECT_EQ(m.content, "text");
  EXPECT_EQ(m.tool_calls.size(), 1u);
}

TEST(ParseK3Malformed, NoThinkingModeStartsInResponse) {
  auto m = k3("plain answer" + kRespEnd + kMsgEnd, /*thinking=*/false);
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "plain answer");
  // Without any markers every byte is content, invalid UTF-8 included.
  const std::string junk = "\xff\xfe<\x80 <|open|";
  EXPECT_EQ(k3(junk, false).content, std::string("\xff\xfe<\x80 ", 5));
}

TEST(ParseK3Malformed, OverlongTagHeaderIsText) {
  // No header is that long: the marker and its text are the reply's, held back no further
  // than kMaxHeaderBytes however it is chunked.
  const std::string body(5000, 'x');
  auto m = k3_quoting("r" + kThinkEnd + kResp + "a<|open|>" + body + kRespEnd + kMsgEnd);
  EXPECT_EQ(m.content, "a<|open|>" + body);
}

// SGLang's _CALL_OPEN_RE: call syntax with attributes outside a tools channel is where its
// reply ends (an unparsed tool section); it is no call (vLLM parses calls only inside the
// tools channel either).
TEST(ParseK3Malformed, CallSyntaxOutsideTheToolsChannel) {
  ParseOptions o = opts(false);
  auto m = parse(ChatFormat::kKimiK3, "Sure. " + call("f", arg("a", "string", "v")) + " rest" + kMsgEnd, o);
  EXPECT_EQ(m.content, "Sure. ");
  EXPECT_TRUE(m.tool_calls.empty());
  // Cut before its <|sep|>, the same: it still reads as a call.
  m = parse(ChatFormat::kKimiK3, "Sure. <|open|>call tool=\"f\" then" + kRespEnd + kMsgEnd, o);
  EXPECT_EQ(m.content, "Sure. ");
  // A real tools channel after it is parsed again.
  m = k3("r" + kThinkEnd + kResp + "a" + call("f", "") + kRespEnd + kTools + call("g", "") + kToolsEnd + kMsgEnd);
  EXPECT_EQ(m.content, "a");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "g");
}

// The think channel: before any reply text it is the reasoning, thinking on or off
// (SGLang's in-band open marker); inside the reply it is dropped when it closes (SGLang),
// and when the reply ends first its opener was a quoted marker: it and the text after it
// are the reply's, verbatim (vLLM keeps the reply's body).
TEST(ParseK3Malformed, ThinkChannelInBandOrQuoted) {
  auto m = k3("\n<|open|>think<|sep|>why" + kThinkEnd + "\n" + kResp + "so" + kRespEnd + kMsgEnd, /*thinking=*/false);
  EXPECT_EQ(m.reasoning, "why");
  EXPECT_EQ(m.content, "so");
  m = k3("<|open|>think<|sep|>why" + kThinkEnd + "so", /*thinking=*/false);  // no response channel
  EXPECT_EQ(m.content, "so");
  m = k3("r" + kThinkEnd + kResp + "a<|open|>think<|sep|>hidden" + kThinkEnd + "b" + kRespEnd + kMsgEnd);
  EXPECT_EQ(m.reasoning, "r");
  EXPECT_EQ(m.content, "ab");
  m = k3_quoting("a<|open|>think<|sep|>cut off", /*thinking=*/false);
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "a<|open|>think<|sep|>cut off");
  // A tools channel ends the reply before the opener closed: it was quoted.
  m = k3_quoting("r" + kThinkEnd + kResp + "a<|open|>think<|sep|>x" + kTools + call("f", "") + kToolsEnd + kMsgEnd);
  EXPECT_EQ(m.content, "a<|open|>think<|sep|>x");
  EXPECT_EQ(m.tool_calls.size(), 1u);
}

// White space alone: the reply when nothing was stripped around it (vLLM and SGLang agree),
// no content when markup was (SGLang) or calls came with it (vLLM).
TEST(ParseK3Malformed, WhiteSpaceOnlyReply) {
  EXPECT_EQ(k3("r" + kThinkEnd + " \n ").content, " \n ");
  EXPECT_EQ(k3(" \t", /*thinking=*/false).content, " \t");
  EXPECT_EQ(k3("r" + kThinkEnd + kResp + " \n " + kRespEnd + kMsgEnd).content, "");
  EXPECT_EQ(k3(" \n " + kRespEnd + kMsgEnd, /*thinking=*/false).content, "");
  EXPECT_EQ(k3(" x " + kRespEnd + kMsgEnd, /*thinking=*/false).content, " x ");
}

TEST(ParseK2Malformed, ThinkSplitWhenLayoutPrecedesIt) {
  auto m = k2("\n<think>why</think>Answer.<|im_end|>");
  EXPECT_EQ(m.reasoning, "why");
  EXPECT_EQ(m.content, "Answer.");
  m = k2("  \n <think>\nwhy \n</think>\n\nAnswer.<|im_end|>");
  EXPECT_EQ(m.reasoning, "\nwhy");  // vLLM strips the reasoning's trailing white space
  EXPECT_EQ(m.content, "\n\nAnswer.");
}

TEST(ParseK2Malformed, Shapes) {
  auto m = k2("<think>why</think>Answer.<|im_end|>");
  EXPECT_EQ(m.reasoning, "why");
  EXPECT_EQ(m.content, "Answer.");

  m = k2("still thinking <think> x");  // never closed: all reasoning, the stray tag dropped
  EXPECT_EQ(m.reasoning, "still thinking  x");

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

  // Unfinished call: dropped. Text after <|im_end|>: not part of the message.
  m = k2("<think>r</think>hi<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\"");
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, "hi");
  EXPECT_EQ(k2("<think>r</think>done<|im_end|>extra").content, "done");

  // White space alone before the tool section is layout; no thinking starts in content.
  m = k2("\n\n<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}"
         "<|tool_call_end|><|tool_calls_section_end|><|im_end|>", false);
  EXPECT_EQ(m.content, "");
  EXPECT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(k2("  just text  ", false).content, "  just text  ");
  // A half-written marker at the end of a stream.
  EXPECT_EQ(k2("<think>r</think>hi<|tool_ca", true).content, "hi");
}

TEST(ParseK2Malformed, CallWithoutSectionMarkers) {
  auto m = k2("ok <|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|><|im_end|>", false);
  EXPECT_EQ(m.content, "ok ");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
}

ParseOptions with_tools(const std::string& tools_json, const std::string& extra = "") {
  auto req = parse_chat_request_text("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":" + tools_json + extra + "}");
  EXPECT_TRUE(req.is_ok()) << req.status().message();
  ParseOptions o = parse_options_for(*req);
  o.thinking = false;
  o.id_seed = 1;
  return o;
}

TEST(ParseK2Names, InferredFromDeclaredToolsWhenTheIdNamesNoFunction) {
  const std::string tools =
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{},"unit":{}}}}},
          {"type":"function","function":{"name":"read_file","parameters":{"type":"object","properties":{"path":{}}}}}])";
  const ParseOptions o = with_tools(tools);
  auto one = [&](const std::string& id, const std::string& args) {
    return parse(ChatFormat::kKimiK2,
                 "<|tool_calls_section_begin|><|tool_call_begin|>" + id + "<|tool_call_argument_begin|>" + args +
                     "<|tool_call_end|><|tool_calls_section_end|>",
                 o);
  };
  for (const std::string id : {"0", "call_3", "toolu_01A09q90qw90lq917835lq9", "functions.get_weather"}) {
    auto m = one(id, "{\"city\": \"Paris\"}");
    ASSERT_EQ(m.tool_calls.size(), 1u) << id;
    EXPECT_EQ(m.tool_calls[0].name, "get_weather") << id;
    EXPECT_EQ(m.tool_calls[0].id, id);
  }
  EXPECT_EQ(one("call_9", "{\"path\": \"/x\"}").tool_calls.at(0).name, "read_file");
  EXPECT_EQ(one("call_9", "{\"nope\": 1}").tool_calls.size(), 0u);  // fits no tool
  EXPECT_EQ(one("call_9", "{}").tool_calls.size(), 0u);             // fits both: ambiguous
  EXPECT_EQ(one("call_9", "{\"city\": ").tool_calls.size(), 0u);    // not JSON
}

TEST(ParseToolChoice, NoCallsWhenNoneOrNoTools) {
  const std::string text = "r<|close|>think<|sep|><|open|>response<|sep|>hi<|close|>response<|sep|><|open|>tools<|sep|>" +
                           call("f", arg("a", "string", "x")) + "<|close|>tools<|sep|>" + kMsgEnd;
  const std::string tools = R"([{"type":"function","function":{"name":"f"}}])";
  ParseOptions none = with_tools(tools, ",\"tool_choice\":\"none\"");
  none.thinking = true;
  auto m = parse(ChatFormat::kKimiK3, text, none);
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, "hi");
  auto req = parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"}]})");
  m = parse(ChatFormat::kKimiK3, text, parse_options_for(*req));
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, "hi");
  ParseOptions autos = with_tools(tools);
  autos.thinking = true;
  EXPECT_EQ(parse(ChatFormat::kKimiK3, text, autos).tool_calls.size(), 1u);
  // K2 alike: the section is parsed and dropped.
  const std::string k2text = "<think>r</think>hi<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                             "<|tool_call_argument_begin|>{\"n\": 123456789012345678901234567890}<|tool_call_end|>"
                             "<|tool_calls_section_end|><|im_end|>";
  m = parse(ChatFormat::kKimiK2, k2text, none);
  EXPECT_EQ(m.tool_calls.size(), 0u);
  EXPECT_EQ(m.content, "hi");
  m = parse(ChatFormat::kKimiK2, k2text, parse_options_for(*req));
  EXPECT_EQ(m.tool_calls.size(), 0u);
  m = parse(ChatFormat::kKimiK2, k2text, autos);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"n\": 123456789012345678901234567890}");  // K2 arguments travel as text
}

TEST(ParseToolChoice, ParallelFalseKeepsTheFirstCall) {
  const std::string tools = R"([{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}])";
  ParseOptions o = with_tools(tools, ",\"parallel_tool_calls\":false");
  const std::string k3text = kResp + "<|close|>response<|sep|>" + kTools + call("f", "") + call("g", "") + kToolsEnd + kMsgEnd;
  auto m = parse(ChatFormat::kKimiK3, k3text, o);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
  const std::string k2text =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.g:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
      "<|tool_call_begin|>functions.f:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
  m = parse(ChatFormat::kKimiK2, k2text, o);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "g");
}

// Inputs the fuzzers found where the cut points once changed the result.
TEST(ParseMalformed, ChunkingNeverChangesTheResult) {
  const std::vector<std::pair<ChatFormat, std::string>> cases = {
      {ChatFormat::kKimiK3, std::string("\x03r<\x00\x00\x00\x05|alose|>think<|se<|sep|>hi<|close|>r>tesponse<'<|close|>"
                                        "response<|sep|><|open|>tools<|sep|><|open|>call toolp|>ii<|clowe|>response<ep|>"
                                        "<|open|>response<|sep|>ii<|clowe|>response<|sep|><|o>onpt|eols<|sep|><|oy=\"apen|>c\" tall ", 196)},
      {ChatFormat::kKimiK2, "<|tool_calls_section_begin|>ls\xff;e<think>r</thin<|to\xeel_call_e\t\t<|i\t\t\tn\t"},
      {ChatFormat::kKimiK3, "r<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|> x \n<|open|>argument key=\"a\"<|sep|>1"
                            "<|close|>argument<|sep|>\n y\t<|close|>call<|sep|> z \n"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    // The first K3 case's half-written markers, cut off by the next marker, are no tags
    // where they stand, and so is the last one's think close after reply text with thinking
    // off: text, kept verbatim (vLLM), so only chunking is checked there.
    for (bool thinking : {false, true})
      parse(cases[i].first, cases[i].second, opts(thinking), /*quoting=*/i == 0 || (i == 2 && !thinking));
  }
  const ParsedMessage m = parse_completion(ChatFormat::kKimiK3, cases[2].second, {});
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": \"1\"}");
  EXPECT_EQ(m.content, "");  // text between arguments and after the call is not content
}

}  // namespace
}  // namespace moonrun::chat
