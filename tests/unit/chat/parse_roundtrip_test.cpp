// parse(render(assistant message)) gives the message back, streamed or not, for K3 and K2:
// every assistant message in the render fixtures (reasoning, parts, tool calls with every
// argument type, escaped names, non-JSON arguments) is rendered alone, the text after the
// generation prompt is parsed, and the result is compared with the message itself.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "chat/chat_request.h"
#include "chat/parse_message.h"
#include "chat/py_json.h"
#include "chat/render_chat.h"

namespace moonrun::chat {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOONRUN_SOURCE_DIR) / "tests/fixtures/chat";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Text that spells a marker cannot come back from a completion: whether the model wrote
// the special token or the same characters, the parser sees the marker and drops it (no
// marker ever reaches a client). Such messages are left out of the round trip.
bool spells_a_marker(const Message& m) {
  std::string text = m.reasoning.value_or("");
  text += m.content.kind == Content::Kind::kText ? m.content.text : "";
  for (const auto& p : m.content.parts) text += p.text;
  for (const char* mk : {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<think>", "</think>", "<|im_",
                         "<|tool_call"})
    if (text.find(mk) != std::string::npos) return true;
  return false;
}

std::vector<Message> fixture_assistant_messages() {
  std::vector<Message> out;
  std::vector<std::filesystem::path> paths;
  for (const auto& e : std::filesystem::directory_iterator(kFixtures / "requests")) paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    auto req = parse_chat_request_text(read_file(p));
    if (!req.is_ok()) continue;
    for (const auto& m : req->messages)
      if (m.role == Role::kAssistant && !spells_a_marker(m)) out.push_back(m);
  }
  return out;
}

std::string content_text(const Content& c) {
  if (c.kind == Content::Kind::kText) return c.text;
  std::string s;
  for (const auto& p : c.parts) s += p.text;
  return s;
}

// What the model would have generated: the rendered message after its generation prompt.
std::string completion_for(ChatFormat format, const Message& m, bool thinking) {
  ChatRequest req;
  req.messages = {m};
  req.thinking = thinking;
  RenderOptions opts;
  opts.add_generation_prompt = false;
  auto segments = render_chat(format, req, opts);
  EXPECT_TRUE(segments.is_ok()) << segments.status().message();
  const std::string text = join_segments(*segments);
  std::string prompt_end;
  if (format == ChatFormat::kKimiK3) {
    prompt_end = thinking ? "<|open|>think<|sep|>" : "<|open|>response<|sep|>";
    const size_t msg = text.find("<|open|>message role=\"assistant\"");
    return text.substr(text.find(prompt_end, msg) + prompt_end.size());
  }
  const size_t msg = text.find("<|im_assistant|>");
  prompt_end = "<|im_middle|>";
  return text.substr(text.find(prompt_end, msg) + prompt_end.size());
}

ParsedMessage parse_streamed(ChatFormat format, const std::string& text, size_t chunk, const ParseOptions& opts) {
  auto parser = make_completion_parser(format, opts);
  ParsedMessage out;
  for (size_t at = 0; at < text.size(); at += chunk) out.append(parser->feed(std::string_view(text).substr(at, chunk)));
  out.append(parser->finish());
  return out;
}

void expect_same(const ParsedMessage& a, const ParsedMessage& b) {
  EXPECT_EQ(a.reasoning, b.reasoning);
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.tool_calls, b.tool_calls);
}

// The arguments string parse should give back for a call, derived from the request: an
// object keeps its keys and values in order (Python json.dumps default separators); a
// string that is no JSON renders as a <json> block, which comes back as {} (vLLM's kimi_k3
// tool parser reads argument tags only); blank means {}.
void expect_arguments(const ToolCall& sent, const std::string& got, ChatFormat format) {
  if (format == ChatFormat::kKimiK2) {
    if (sent.arguments.is_string()) {
      const std::string sent_text(py_strip(sent.arguments.get<std::string>()));
      EXPECT_EQ(sent_text.empty() ? "{}" : sent_text, got);  // K2 arguments travel as text
    } else EXPECT_EQ(Json::parse(got), sent.arguments.is_null() ? Json::object() : sent.arguments);
    return;
  }
  if (sent.arguments.is_string()) {
    const std::string& s = sent.arguments.get<std::string>();
    if (py_is_blank(s)) {
      EXPECT_EQ(got, "{}");
      return;
    }
    // The encoder json.loads the string; the parser json.dumps what it reads back.
    const std::optional<PyJson> parsed = py_json_loads(s);
    if (!parsed) {
      EXPECT_EQ(got, "{}");  // rendered as a <json> block, which is no argument tag
      return;
    }
    EXPECT_EQ(got, py_json_dumps(*parsed, JsonSeparators::kPythonDefault));
    return;
  }
  EXPECT_EQ(Json::parse(got), sent.arguments.is_null() ? Json::object() : sent.arguments);
}

void round_trip(ChatFormat format, bool thinking) {
  const auto messages = fixture_assistant_messages();
  ASSERT_GE(messages.size(), 15u);
  for (size_t i = 0; i < messages.size(); ++i) {
    Message m = messages[i];
    // In K2 the call id is the only place the prompt names the function, so K2 ids have the
    // form functions.NAME:IDX (what vLLM hands out for Kimi models and what K2 generates).
    if (format == ChatFormat::kKimiK2)
      for (size_t c = 0; c < m.tool_calls.size(); ++c)
        m.tool_calls[c].id = "functions." + m.tool_calls[c].name + ":" + std::to_string(c);
    SCOPED_TRACE("assistant message " + std::to_string(i));
    const std::string completion = completion_for(format, m, thinking);
    ParseOptions opts;
    opts.thinking = thinking;
    opts.id_seed = 42;
    const ParsedMessage whole = parse_completion(format, completion, opts);

    // Reasoning: K3 renders it when thinking and not blank; the K2 template keeps it only on
    // turns after the last plain assistant message (here: when the message has tool calls).
    std::string want_reasoning;
    if (m.reasoning) {
      if (format == ChatFormat::kKimiK3 && thinking && !py_is_blank(*m.reasoning)) want_reasoning = *m.reasoning;
      if (format == ChatFormat::kKimiK2 && !m.tool_calls.empty()) want_reasoning = *m.reasoning;
    }
    EXPECT_EQ(whole.reasoning, want_reasoning) << completion;
    EXPECT_EQ(whole.content, content_text(m.content)) << completion;
    ASSERT_EQ(whole.tool_calls.size(), m.tool_calls.size()) << completion;
    for (size_t c = 0; c < m.tool_calls.size(); ++c) {
      EXPECT_EQ(whole.tool_calls[c].name, m.tool_calls[c].name);
      expect_arguments(m.tool_calls[c], whole.tool_calls[c].arguments, format);
      if (format == ChatFormat::kKimiK2) EXPECT_EQ(whole.tool_calls[c].id, *m.tool_calls[c].id);
    }
    for (size_t chunk : {1, 2, 3, 5, 8, 13, 64}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      expect_same(parse_streamed(format, completion, chunk, opts), whole);
    }
  }
}

TEST(ParseRoundTrip, K3Thinking) { round_trip(ChatFormat::kKimiK3, true); }
TEST(ParseRoundTrip, K3NoThinking) { round_trip(ChatFormat::kKimiK3, false); }
TEST(ParseRoundTrip, K2) { round_trip(ChatFormat::kKimiK2, true); }

TEST(ParseRoundTrip, EverySplitPoint) {
  // Two chunks, split at every byte: markers, tag headers and UTF-8 cut anywhere.
  for (ChatFormat format : {ChatFormat::kKimiK3, ChatFormat::kKimiK2}) {
    for (const Message& m : fixture_assistant_messages()) {
      if (m.tool_calls.empty()) continue;
      const std::string completion = completion_for(format, m, true);
      ParseOptions opts;
      opts.id_seed = 7;
      const ParsedMessage whole = parse_completion(format, completion, opts);
      for (size_t cut = 0; cut <= completion.size(); ++cut) {
        auto parser = make_completion_parser(format, opts);
        ParsedMessage split;
        split.append(parser->feed(std::string_view(completion).substr(0, cut)));
        split.append(parser->feed(std::string_view(completion).substr(cut)));
        split.append(parser->finish());
        ASSERT_EQ(split.to_json(), whole.to_json()) << "cut at " << cut << " of " << completion;
      }
    }
  }
}

TEST(ParseIds, K3IdsAreUniqueAndShapedLikeVllm) {
  const std::string call = "<|open|>call tool=\"f\" index=\"1\"<|sep|><|close|>call<|sep|>";
  std::string completion = "r<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>";
  for (int i = 0; i < 50; ++i) completion += call;
  completion += "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
  const ParsedMessage m = parse_completion(ChatFormat::kKimiK3, completion, {});
  ASSERT_EQ(m.tool_calls.size(), 50u);
  std::set<std::string> ids;
  for (const auto& tc : m.tool_calls) {
    EXPECT_EQ(tc.id.rfind("chatcmpl-tool-", 0), 0u);
    EXPECT_EQ(tc.id.size(), std::string("chatcmpl-tool-").size() + 32);
    EXPECT_EQ(tc.arguments, "{}");
    ids.insert(tc.id);
  }
  EXPECT_EQ(ids.size(), 50u);
}

}  // namespace
}  // namespace moonrun::chat
