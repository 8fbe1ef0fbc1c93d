// Completions with what the peers give for them, parsed whole and streamed in every chunk
// size up to 9 bytes: the message must be the peer's, and no control marker may reach
// reasoning or content. peer_cases.json: the cases the peers' own tests assert on (vLLM's
// kimi_k2 / kimi_k3 tool and reasoning parser tests, SGLang's kimik3 detector tests,
// vllm-ascend's and LightLLM's K3 parser tests; each names its test); vllm_k3_cases.json:
// vLLM's kimi_k3 parsers run on a corpus of K3 completions (outputs only).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "chat/chat_request.h"
#include "chat/parse_message.h"

namespace moonrun::chat {
namespace {

const std::filesystem::path kParseFixtures = std::filesystem::path(MOONRUN_SOURCE_DIR) / "tests/fixtures/chat/parse";

Json load_cases(const char* file) {
  std::ifstream in(kParseFixtures / file);
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

ParseOptions options_for(const Json& c) {
  // The request the completion answers, as the server would parse it: a case that names
  // tools, a tool_choice or "request" (a request that declares no tools) gets the
  // server's options; one without is the parser on its own (`moonrun parse`).
  Json body = {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}};
  if (c.contains("tools")) body["tools"] = c["tools"];
  if (c.contains("tool_choice")) body["tool_choice"] = c["tool_choice"];
  ParseOptions o;
  if (c.contains("tools") || c.contains("tool_choice") || c.contains("request")) {
    auto req = parse_chat_request(body);
    EXPECT_TRUE(req.is_ok()) << req.status().message();
    o = parse_options_for(*req);
  }
  o.thinking = c["thinking"].get<bool>();
  o.id_seed = 3;
  return o;
}

ParsedMessage parse_chunked(ChatFormat f, const std::string& text, size_t chunk, const ParseOptions& o) {
  auto parser = make_completion_parser(f, o);
  ParsedMessage m;
  for (size_t at = 0; at < text.size(); at += chunk) m.append(parser->feed(std::string_view(text).substr(at, chunk)));
  m.append(parser->finish());
  return m;
}

// Every control marker of both formats; none may reach a client as text.
const char* const kMarkers[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<|tool_calls_section_begin|>",
                                "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
                                "<|tool_call_argument_begin|>", "<|im_end|>", "<think>", "</think>"};

// No marker in reasoning or content but those the expected text quotes (K3 markers that
// are no tags where they stand stay verbatim, as vLLM keeps them).
void expect_no_markers(const ParsedMessage& m, const Json& want) {
  const auto quoted = [&](const char* field, const char* mk) {
    return want.contains(field) && want[field].get<std::string>().find(mk) != std::string::npos;
  };
  for (const char* mk : kMarkers) {
    if (!quoted("reasoning", mk)) EXPECT_EQ(m.reasoning.find(mk), std::string::npos) << mk << " in reasoning: " << m.reasoning;
    if (!quoted("content", mk)) EXPECT_EQ(m.content.find(mk), std::string::npos) << mk << " in content: " << m.content;
  }
}

void check_cases(const Json& cases) {
  for (const Json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>() + " (" + c["source"].get<std::string>() + ")");
    const ChatFormat format = *chat_format_from_name(c["format"].get<std::string>());
    const std::string text = c["completion"].get<std::string>();
    const ParseOptions o = options_for(c);
    const ParsedMessage whole = parse_completion(format, text, o);
    // Where moonrun deliberately follows another peer's test, the case says which, and
    // what that test asserts replaces the field it names.
    Json want = c["expected"];
    if (c.contains("moonrun_differs"))
      for (const auto& [k, v] : c["moonrun_differs"]["expected"].items()) want[k] = v;
    if (want.contains("reasoning")) EXPECT_EQ(whole.reasoning, want["reasoning"].get<std::string>());
    if (want.contains("content")) EXPECT_EQ(whole.content, want["content"].get<std::string>());
    if (want.contains("tool_calls")) {
      EXPECT_EQ(whole.tool_calls.size(), want["tool_calls"].size()) << whole.to_json().dump();
      for (size_t i = 0; i < std::min(whole.tool_calls.size(), want["tool_calls"].size()); ++i) {
        const Json& w = want["tool_calls"][i];
        EXPECT_EQ(whole.tool_calls[i].name, w["name"].get<std::string>());
        EXPECT_EQ(whole.tool_calls[i].arguments, w["arguments"].get<std::string>());
        if (w.contains("id")) EXPECT_EQ(whole.tool_calls[i].id, w["id"].get<std::string>());
      }
    }
    expect_no_markers(whole, want);
    for (size_t chunk = 1; chunk <= 9; ++chunk) {
      const ParsedMessage streamed = parse_chunked(format, text, chunk, o);
      EXPECT_EQ(streamed.to_json(), whole.to_json()) << "chunk " << chunk;
      expect_no_markers(streamed, want);
    }
  }
}

TEST(ParsePeerCases, AsThePeerTestsAssert) {
  const Json cases = load_cases("peer_cases.json")["cases"];
  ASSERT_GE(cases.size(), 20u);
  check_cases(cases);
}

// 93 K3 completions (well-formed, every argument type, escapes, missing closes, stray
// layout, tool_choice none, thinking on and off) with what vLLM's kimi_k3 parsers give.
TEST(ParsePeerCases, AsVllmKimiK3Parses) {
  const Json cases = load_cases("vllm_k3_cases.json")["cases"];
  ASSERT_GE(cases.size(), 90u);
  check_cases(cases);
}

}  // namespace
}  // namespace moonrun::chat
