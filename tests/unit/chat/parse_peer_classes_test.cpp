// Issue 48's parser classes, each parsed whole and streamed one byte at a time (the
// streamed deltas must add up to the whole message, and no delta may carry what the whole
// message does not): what moonrun gives follows the peer named beside each case.
//   - Calls where none may be: tool_choice "none" (vLLM's KimiK3Parser) or no tools
//     declared (SGLang's kimik3 detector): no call, and none of its XTML in the content.
//   - A call whose arguments are a JSON block: as vLLM's kimi_k3 tool parser reads a call,
//     from its argument tags only.
//   - Quoted markers: a marker that is no tag where it stands (prose that quotes another
//     channel's markup) stays in the text verbatim, as vLLM's kimi_k3 parsers keep the
//     response channel's body; real markup never shows, and a think channel that closes
//     inside the reply is dropped (SGLang).
#include <gtest/gtest.h>

#include "chat/chat_request.h"
#include "chat/parse_message.h"

namespace moonrun::chat {
namespace {

const std::string kThinkEnd = "<|close|>think<|sep|>";
const std::string kResp = "<|open|>response<|sep|>";
const std::string kRespEnd = "<|close|>response<|sep|>";
const std::string kTools = "<|open|>tools<|sep|>";
const std::string kToolsEnd = "<|close|>tools<|sep|>";
const std::string kMsgEnd = "<|close|>message<|sep|><|end_of_msg|>";

std::string arg(const std::string& key, const std::string& type, const std::string& value) {
  return "<|open|>argument key=\"" + key + "\" type=\"" + type + "\"<|sep|>" + value + "<|close|>argument<|sep|>";
}
std::string call(const std::string& name, const std::string& body, int index = 1) {
  return "<|open|>call tool=\"" + name + "\" index=\"" + std::to_string(index) + "\"<|sep|>" + body + "<|close|>call<|sep|>";
}
std::string json_block(const std::string& raw) { return "<|open|>json type=\"object\"<|sep|>" + raw + "<|close|>json<|sep|>"; }

// The options the server derives from a request (chat_pipeline: parse_options_for), for a
// request with `extra` fields ("" declares no tools).
ParseOptions request_options(const std::string& extra, bool thinking) {
  auto req = parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"}])" + extra + "}");
  EXPECT_TRUE(req.is_ok()) << req.status().message();
  ParseOptions o = parse_options_for(*req);
  o.thinking = thinking;
  o.id_seed = 7;
  return o;
}
const std::string kDeclared =
    R"(,"tools":[{"type":"function","function":{"name":"get_time"}},)"
    R"({"type":"function","function":{"name":"plan_trip","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";
ParseOptions none_choice(bool thinking) { return request_options(kDeclared + R"(,"tool_choice":"none")", thinking); }
ParseOptions no_tools(bool thinking) { return request_options("", thinking); }
ParseOptions auto_choice(bool thinking) { return request_options(kDeclared + R"(,"tool_choice":"auto")", thinking); }

const char* const kMarkers[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};

// Whole, and streamed one byte at a time: the same message, no marker in reasoning or
// content (unless the text quotes markers: `quoting`), and no streamed delta with a call
// the whole message does not have.
ParsedMessage parse(const std::string& text, const ParseOptions& o, bool quoting = false) {
  const ParsedMessage whole = parse_completion(ChatFormat::kKimiK3, text, o);
  auto parser = make_completion_parser(ChatFormat::kKimiK3, o);
  ParsedMessage streamed;
  size_t streamed_calls = 0;
  for (size_t at = 0; at < text.size(); ++at) {
    const ParseDelta d = parser->feed(std::string_view(text).substr(at, 1));
    streamed_calls += d.tool_calls.size();
    streamed.append(d);
  }
  const ParseDelta last = parser->finish();
  streamed_calls += last.tool_calls.size();
  streamed.append(last);
  EXPECT_EQ(streamed.to_json(), whole.to_json()) << "one byte at a time: " << text;
  EXPECT_EQ(streamed_calls, whole.tool_calls.size()) << text;
  if (quoting) return whole;
  for (const char* mk : kMarkers) {
    EXPECT_EQ(whole.reasoning.find(mk), std::string::npos) << mk << " in the reasoning of " << text;
    EXPECT_EQ(whole.content.find(mk), std::string::npos) << mk << " in the content of " << text;
  }
  return whole;
}

TEST(ParseCallsWhereNoneMayBe, ToolChoiceNoneGivesTheResponseChannelAndNoCall) {
  // vLLM's KimiK3Parser with tool_choice "none": the tool parser still runs for the
  // content (the response channel's body), and the calls are dropped ([]), whole and
  // streamed (its streaming path empties each delta's tool_calls).
  const std::string calls = kTools + call("get_time", "") + call("plan_trip", arg("city", "string", "Paris"), 2) + kToolsEnd;
  for (bool thinking : {true, false}) {
    SCOPED_TRACE(thinking ? "thinking" : "no thinking");
    const std::string head = thinking ? "why" + kThinkEnd : "";
    const std::string text = head + kResp + "No tool is needed." + kRespEnd + calls + kMsgEnd;
    ParsedMessage m = parse(text, none_choice(thinking));
    EXPECT_TRUE(m.tool_calls.empty());
    EXPECT_EQ(m.content, "No tool is needed.");
    EXPECT_EQ(m.reasoning, thinking ? "why" : "");
    // The same completion with tool_choice auto: the calls are there.
    m = parse(text, auto_choice(thinking));
    ASSERT_EQ(m.tool_calls.size(), 2u);
    EXPECT_EQ(m.tool_calls[1].arguments, "{\"city\": \"Paris\"}");
    EXPECT_EQ(m.content, "No tool is needed.");
  }
}

TEST(ParseCallsWhereNoneMayBe, ToolChoiceNoneWithoutAResponseChannel) {
  // vLLM: without a response channel the content is the text before the tools channel,
  // with <|close|>response<|sep|> stripped (the open marker was the generation prompt).
  ParsedMessage m = parse("Sure." + kRespEnd + kTools + call("get_time", "") + kToolsEnd + kMsgEnd, none_choice(false));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "Sure.");
  // Thinking straight into the tools channel: no content at all, and no call.
  m = parse("plan" + kThinkEnd + kTools + call("get_time", "") + kToolsEnd + kMsgEnd, none_choice(true));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.reasoning, "plan");
  EXPECT_EQ(m.content, "");
  // A tools channel the model never closed (max_tokens): still no call, no markup.
  m = parse("ok" + kRespEnd + kTools + call("get_time", ""), none_choice(false));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "ok");
}

TEST(ParseCallsWhereNoneMayBe, NoToolsDeclaredStripsTheToolsChannel) {
  // SGLang's kimik3 detector with no tools declared (test_parser_strips_when_no_tools_
  // declared, test_unparsed_tools_section_dropped_with_reply_kept): the tools section is
  // stripped from the reply, the reply around it is kept, no call is returned.
  const std::string section =
      kTools + call("read_agent", arg("id", "string", "worker_1")) + kToolsEnd + kMsgEnd;
  ParsedMessage m = parse(section, no_tools(false));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "");
  m = parse(kResp + "on it" + kRespEnd + section, no_tools(false));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "on it");
  m = parse("deliberating" + kThinkEnd + kResp + "on it" + kRespEnd + section, no_tools(true));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.reasoning, "deliberating");
  EXPECT_EQ(m.content, "on it");
  // Call syntax in the reply itself, outside any tools channel: SGLang cuts the reply at it
  // (_CALL_OPEN_RE), and it is no call.
  m = parse("Let me check " + call("read_agent", arg("id", "string", "worker_1")) + kMsgEnd, no_tools(false));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "Let me check ");
}

TEST(ParseCallsWhereNoneMayBe, ToolChoiceNoneDropsJsonBlockCallsToo) {
  // vLLM's KimiK3Parser drops every call under tool_choice none, whatever its arguments.
  const std::string text = kResp + "fine" + kRespEnd + kTools + call("plan_trip", json_block("{\"city\":\"Rome\"}")) +
                           call("get_time", "", 2) + kToolsEnd + kMsgEnd;
  ParsedMessage m = parse(text, none_choice(false));
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "fine");
  EXPECT_TRUE(parse(text, no_tools(false)).tool_calls.empty());  // SGLang: no tools, no calls
}

TEST(ParseJsonBlockArguments, AsVllmsKimiK3ToolParserReadsThem) {
  // vLLM's kimi_k3 tool parser (_decode_call): a call's arguments are the argument tags
  // its body holds, decoded by type, as json.dumps writes the object; a JSON block is not
  // an argument tag, so a call that carries only one has arguments {}.
  const ParseOptions o = auto_choice(false);
  ParsedMessage m = parse(kResp + kRespEnd + kTools + call("plan_trip", json_block("{\"city\":\"New York\",\"days\":2}")) +
                              call("get_time", "", 2) + kToolsEnd + kMsgEnd,
                          o);
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].name, "plan_trip");
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");
  EXPECT_EQ(m.tool_calls[1].name, "get_time");
  EXPECT_EQ(m.tool_calls[1].arguments, "{}");
  EXPECT_EQ(m.content, "");

  // Not JSON inside the block: still {} (vLLM never reads the block).
  m = parse(kTools + call("plan_trip", json_block("{\"city\":\"unfinished\"")) + kToolsEnd, o);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");

  // Argument tags beside the block are the arguments (vLLM's _arg_re scans the whole body).
  m = parse(kTools + call("plan_trip", json_block("{\"x\": 1}") + arg("city", "string", "Oslo") + arg("days", "number", "3")) +
                kToolsEnd,
            o);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"city\": \"Oslo\", \"days\": 3}");

  // ... and so are argument tags inside the block's body.
  m = parse(kTools + call("plan_trip", "<|open|>json type=\"object\"<|sep|>{" + arg("city", "string", "Lima") + "}<|close|>json<|sep|>") +
                kToolsEnd,
            o);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"city\": \"Lima\"}");

  // The reply beside such a call is untouched, with thinking too.
  m = parse("hmm" + kThinkEnd + kResp + "Booking." + kRespEnd + kTools + call("plan_trip", json_block("[1, 2]")) + kToolsEnd +
                kMsgEnd,
            auto_choice(true));
  EXPECT_EQ(m.reasoning, "hmm");
  EXPECT_EQ(m.content, "Booking.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");

  // A block that never closes before the call does: the call still closes there.
  m = parse(kTools + call("get_time", "<|open|>json type=\"object\"<|sep|>{\"tz\": \"UTC\"}") + kToolsEnd, o);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");
}

ParsedMessage quoting(const std::string& text, const ParseOptions& o) { return parse(text, o, /*quoting=*/true); }

TEST(ParseQuotedMarkers, AQuotedThinkOpenerStaysVerbatim) {
  // vLLM's kimi_k3 tool parser gives the response channel's body as generated, up to
  // <|close|>response<|sep|> (or, without a response opener, the text before the tools
  // channel with the response and message closes taken out), so prose that quotes another
  // channel's marker keeps it. What tells the quoted think opener from a real one: before
  // any reply text it opens the reasoning (SGLang's in-band marker); after reply text it
  // is a think channel only if <|close|>think comes before the reply ends (SGLang drops
  // such a channel); if the reply ends first (its close, a tools channel, the message's
  // end, the end of the stream) the opener was quoted, and it stays with what follows.
  const std::string quote = "see <|open|>think<|sep|> and the rest";
  for (bool thinking : {true, false}) {
    SCOPED_TRACE(thinking ? "thinking" : "no thinking");
    const std::string head = thinking ? "r" + kThinkEnd : "";
    ParsedMessage m = quoting(head + kResp + quote + kRespEnd + kMsgEnd, auto_choice(thinking));
    EXPECT_EQ(m.content, quote);
    EXPECT_EQ(m.reasoning, thinking ? "r" : "");
    // The same for tool_choice "none" and for a request without tools (vLLM's tool parser
    // and reasoning parser unwrap the same body).
    EXPECT_EQ(quoting(head + kResp + quote + kRespEnd + kMsgEnd, none_choice(thinking)).content, quote);
    EXPECT_EQ(quoting(head + kResp + quote + kRespEnd + kMsgEnd, no_tools(thinking)).content, quote);
    // A tools channel ends the reply: the text is kept, and the calls are still parsed.
    m = quoting(head + kResp + quote + kTools + call("get_time", "") + kToolsEnd + kMsgEnd, auto_choice(thinking));
    EXPECT_EQ(m.content, quote);
    EXPECT_EQ(m.tool_calls.size(), 1u);
    // Cut off by max_tokens mid-reply: the text is kept.
    EXPECT_EQ(quoting(head + kResp + quote, auto_choice(thinking)).content, quote);
  }
  // The reply's own opener taken by the generation prompt (thinking off): vLLM's body is
  // the text before <|close|>response<|sep|>.
  EXPECT_EQ(quoting(quote + kRespEnd + kMsgEnd, auto_choice(false)).content, quote);
  EXPECT_EQ(quoting(quote + kRespEnd + kMsgEnd, no_tools(false)).content, quote);
  // Where it stands decides: an opener that closes inside the reply is a think channel
  // (dropped), a later one the reply ends before is quoted; a close that ends nothing is
  // quoted too.
  const std::string twice = "open <|open|>think<|sep|> and close <|close|>think<|sep|>... no, <|open|>think<|sep|> again";
  EXPECT_EQ(quoting("r" + kThinkEnd + kResp + twice + kRespEnd + kMsgEnd, auto_choice(true)).content,
            "open ... no, <|open|>think<|sep|> again");
  EXPECT_EQ(quoting(kResp + "close with <|close|>think<|sep|>, then <|open|>think<|sep|>" + kRespEnd, auto_choice(false)).content,
            "close with <|close|>think<|sep|>, then <|open|>think<|sep|>");
}

TEST(ParseQuotedMarkers, OtherChannelsMarkersQuotedInTheReplyStayVerbatim) {
  for (bool thinking : {true, false}) {
    SCOPED_TRACE(thinking ? "thinking" : "no thinking");
    const std::string head = (thinking ? "r" + kThinkEnd : "") + kResp;
    // A response opener inside the response channel (vLLM's body runs from the first).
    const std::string reopen = "a reply opens with <|open|>response<|sep|> and ends with the close";
    EXPECT_EQ(quoting(head + reopen + kRespEnd + kMsgEnd, auto_choice(thinking)).content, reopen);
    // Argument, call-close, json and unknown tags; bare markers with no tag around them.
    const std::string tags =
        "write <|open|>argument key=\"k\" type=\"string\"<|sep|>v<|close|>argument<|sep|>, "
        "<|open|>json type=\"object\"<|sep|>{}<|close|>json<|sep|>, <|close|>call<|sep|>, <|open|>foo<|sep|>";
    EXPECT_EQ(quoting(head + tags + kRespEnd + kMsgEnd, auto_choice(thinking)).content, tags);
    const std::string bare = "the markers are <|open|>, <|close|> and <|sep|>.";
    EXPECT_EQ(quoting(head + bare + kRespEnd + kMsgEnd, auto_choice(thinking)).content, bare);
    EXPECT_EQ(quoting(head + bare + kRespEnd + kMsgEnd, none_choice(thinking)).content, bare);
    // A marker cut off by another marker before its <|sep|> is text too.
    EXPECT_EQ(quoting(head + "x <|open|>think y " + kRespEnd + kMsgEnd, auto_choice(thinking)).content, "x <|open|>think y ");
  }
  // SGLang's test_quoted_call_token_without_attributes_survives strips the marker and its
  // name ("calls open with , then attributes"); vLLM's tool parser keeps the reply as
  // generated, and so does moonrun.
  EXPECT_EQ(quoting("calls open with <|open|>call, then attributes", auto_choice(false)).content,
            "calls open with <|open|>call, then attributes");
  // In the reasoning, too: vLLM's reasoning is the think channel's text as generated.
  ParsedMessage m = quoting("args read <|open|>argument key=\"k\"<|sep|> and <|sep|>" + kThinkEnd + kResp + "ok" + kRespEnd,
                            auto_choice(true));
  EXPECT_EQ(m.reasoning, "args read <|open|>argument key=\"k\"<|sep|> and <|sep|>");
  EXPECT_EQ(m.content, "ok");
}

TEST(ParseQuotedMarkers, RealMarkupStillNeverShows) {
  // Markup where it is a tag, or cut off where it could still have become one, never
  // reaches the text (parse() checks every marker spelling).
  for (bool thinking : {true, false}) {
    SCOPED_TRACE(thinking ? "thinking" : "no thinking");
    const std::string head = thinking ? "r" + kThinkEnd : "";
    // The prompt's openers repeated before any reply text are layout.
    EXPECT_EQ(parse(head + kResp + kResp + "hi" + kRespEnd + kMsgEnd, auto_choice(thinking)).content, "hi");
    EXPECT_EQ(parse(head + "<|open|>message role=\"assistant\"<|sep|>" + kResp + "hi" + kRespEnd + kMsgEnd, auto_choice(thinking)).content,
              "hi");
    // Cut off by max_tokens while it could still become a tag: nothing of it.
    EXPECT_EQ(parse(head + kResp + "done<|close|>resp", auto_choice(thinking)).content, "done");
    EXPECT_EQ(parse(head + kResp + "done<|open|>tool", auto_choice(thinking)).content, "done");
    EXPECT_EQ(parse(head + kResp + "done<|open|>", auto_choice(thinking)).content, "done");
    // Text between channels, and the tools channel's markup, stay out.
    ParsedMessage m = parse(head + kResp + "a" + kRespEnd + "<|sep|> x <|open|>foo<|sep|>" + kTools +
                                call("get_time", "") + "<|sep|>" + kToolsEnd + kMsgEnd,
                            auto_choice(thinking));
    EXPECT_EQ(m.content, "a");
    EXPECT_EQ(m.tool_calls.size(), 1u);
  }
  // Without a response channel, a stray response close is dropped (vLLM's
  // _strip_response_content), and the text around it is the reply's.
  EXPECT_EQ(parse("r" + kThinkEnd + "plain" + kRespEnd + kMsgEnd, auto_choice(true)).content, "plain");
  // Call syntax after the quoted opener ends the reply there, as anywhere in the reply
  // (SGLang's _CALL_OPEN_RE), and is no call.
  const std::string quote = "see <|open|>think<|sep|> and the rest";
  ParsedMessage cut = quoting(kResp + quote + " " + call("get_time", arg("tz", "string", "UTC")) + " tail" + kMsgEnd, auto_choice(false));
  EXPECT_EQ(cut.content, quote + " ");
  EXPECT_TRUE(cut.tool_calls.empty());
  // A think channel that closes inside the reply is not the reply (SGLang's kimik3
  // reasoning detector never folds reasoning into it).
  ParsedMessage m = parse("r" + kThinkEnd + kResp + "a<|open|>think<|sep|>hidden" + kThinkEnd + "b" + kRespEnd + kMsgEnd,
                          auto_choice(true));
  EXPECT_EQ(m.content, "ab");
  // Before any reply text, the opener is the reasoning (SGLang's in-band open marker).
  m = parse("<|open|>think<|sep|>why" + kThinkEnd + kResp + "so" + kRespEnd + kMsgEnd, auto_choice(false));
  EXPECT_EQ(m.reasoning, "why");
  EXPECT_EQ(m.content, "so");
}

}  // namespace
}  // namespace moonrun::chat
