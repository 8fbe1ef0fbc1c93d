// The Messages and Responses request mappings on the shapes Claude Code, Codex and the AI
// SDK send (messages_request.h, responses_request.h), and the bounded response store.
#include <gtest/gtest.h>

#include <string>

#include "server/messages_request.h"
#include "server/response_store.h"
#include "server/responses_request.h"

namespace moonrun::server {
namespace {

using chat::Json;

Json parse(const std::string& s) { return Json::parse(s); }

std::string error_of(const Status& st) { return st.message(); }

TEST(MessagesRequest, SystemTurnsStayWhereTheyStand) {
  auto r = messages_to_chat(parse(R"({"max_tokens": 10, "system": "top",
    "messages": [{"role": "user", "content": "q"}, {"role": "system", "content": [{"type": "text", "text": "env"}]}]})"));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const Json& m = r->chat_body["messages"];
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_EQ(m[1]["role"], "user");
  EXPECT_EQ(m[2]["role"], "system");
  EXPECT_EQ(m[2]["content"], "env");
}

TEST(MessagesRequest, ThinkingEffortFormatAndContextManagement) {
  auto r = messages_to_chat(parse(R"({"max_tokens": 32000, "messages": [{"role": "user", "content": "q"}],
    "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "medium",
    "format": {"type": "json_schema", "schema": {"type": "object"}}},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}})"));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->thinking_omitted);
  EXPECT_TRUE(r->context_management);
  EXPECT_EQ(r->chat_body["reasoning_effort"], "high");  // K3 has no medium
  EXPECT_EQ(r->chat_body["response_format"]["type"], "json_schema");
  EXPECT_EQ(r->chat_body["response_format"]["json_schema"]["schema"], parse(R"({"type": "object"})"));
  auto off = messages_to_chat(parse(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "q"}],
    "thinking": {"type": "disabled"}})"));
  EXPECT_EQ(off->chat_body["chat_template_kwargs"]["thinking"], false);
  for (const char* bad : {R"("thinking": {"type": "sometimes"})", R"("output_config": {"effort": "huge"})",
                          R"("output_config": {"format": {"type": "regex"}})", R"("context_management": {"edits": [{}]})",
                          R"("mcp_servers": [{"url": "x"}])", R"("tools": [{"type": "web_search_20250305", "name": "w"}])"}) {
    auto e = messages_to_chat(parse(std::string(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "q"}], )") + bad + "}"));
    EXPECT_FALSE(e.is_ok()) << bad;
  }
}

TEST(MessagesRequest, DeferredToolsAppearWhenReferenced) {
  auto r = messages_to_chat(parse(R"({"max_tokens": 10,
    "tools": [{"name": "shown", "input_schema": {"type": "object"}},
              {"name": "later", "input_schema": {"type": "object"}, "defer_loading": true}],
    "messages": [{"role": "user", "content": "q"},
                 {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shown", "input": {}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                   "content": [{"type": "tool_reference", "tool_name": "later"}]}]}]})"));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->chat_body["tools"].size(), 1u);
  EXPECT_EQ(r->chat_body["tools"][0]["function"]["name"], "shown");
  const Json& last = r->chat_body["messages"].back();
  EXPECT_EQ(last["role"], "system");  // the mid-conversation declaration
  EXPECT_EQ(last["tools"][0]["function"]["name"], "later");
  auto unknown = messages_to_chat(parse(R"({"max_tokens": 10, "messages": [{"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "tool_reference", "tool_name": "nope"}]}]}]})"));
  EXPECT_NE(error_of(unknown.status()).find("messages[0].content[0].content[0].tool_name"), std::string::npos);
}

TEST(MessagesRequest, OmittedThinkingComesBackThroughTheSignature) {
  const std::string sig = thinking_signature("step one, then two");
  auto r = messages_to_chat(parse(R"({"max_tokens": 10, "messages": [{"role": "user", "content": "q"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": ")" + sig + R"("},
                                      {"type": "text", "text": "a"}]}]})"));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->chat_body["messages"][1]["reasoning_content"], "step one, then two");
  // Another provider's signature tells nothing.
  auto other = messages_to_chat(parse(R"({"max_tokens": 10, "messages": [{"role": "user", "content": "q"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": "EqQBCkgIARAB"}]}]})"));
  EXPECT_FALSE(other->chat_body["messages"][1].contains("reasoning_content"));
}

TEST(MessagesRequest, CountTokensNeedsNoMaxTokensAndContextTextsAreAnthropics) {
  EXPECT_TRUE(messages_to_chat(parse(R"({"messages": [{"role": "user", "content": "q"}]})"), MessagesRoute::kCountTokens).is_ok());
  EXPECT_FALSE(messages_to_chat(parse(R"({"messages": [{"role": "user", "content": "q"}]})")).is_ok());
  int max_tokens = 32000;
  EXPECT_EQ(error_of(anthropic_fit_context(8192, 738, max_tokens)),
            "input length and `max_tokens` exceed context limit: 738 + 32000 > 8192, decrease input length or "
            "`max_tokens` and try again");
  EXPECT_EQ(error_of(anthropic_fit_context(8192, 9000, max_tokens)), "prompt is too long: 9000 tokens > 8191 maximum");
  max_tokens = 100;
  EXPECT_TRUE(anthropic_fit_context(8192, 738, max_tokens).is_ok());
}

TEST(ResponsesRequest, NamespacesFlattenAndHostedToolsAreDropped) {
  auto r = responses_to_chat(parse(R"({"input": "q", "tools": [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    {"type": "namespace", "name": "mcp__seed", "tools": [{"type": "function", "name": "calculate"}]},
    {"type": "web_search", "external_web_access": false}]})"), nullptr);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->chat_body["tools"].size(), 2u);
  EXPECT_EQ(r->chat_body["tools"][1]["function"]["name"], "calculate");
  EXPECT_EQ(r->tool_namespace.at("calculate"), "mcp__seed");
  ASSERT_EQ(r->dropped_tools.size(), 1u);
  EXPECT_EQ(r->dropped_tools[0], "tools[2] (web_search)");
  auto dup = responses_to_chat(parse(R"({"input": "q", "tools": [{"type": "function", "name": "a"},
    {"type": "namespace", "name": "n", "tools": [{"type": "function", "name": "a"}]}]})"), nullptr);
  EXPECT_EQ(error_of(dup.status()).rfind("tools[1].tools[0].name", 0), 0u);
  EXPECT_FALSE(responses_to_chat(parse(R"({"input": "q", "tools": [{"type": "custom", "name": "p"}]})"), nullptr).is_ok());
}

TEST(ResponsesRequest, DeveloperMessagesAreSystemMessages) {
  auto r = responses_to_chat(parse(R"({"input": [{"type": "message", "role": "developer",
    "content": [{"type": "input_text", "text": "You are Codex."}]}, {"role": "user", "content": "q"}]})"), nullptr);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->chat_body["messages"][0]["role"], "system");
  EXPECT_EQ(r->chat_body["messages"][0]["content"], "You are Codex.");
}

TEST(ResponsesRequest, ItemReferencesAndPreviousResponsesResolveFromTheStore) {
  ResponseStore store;
  store.put("resp-1", parse(R"([{"type": "message", "role": "user", "content": "first"}])"),
            parse(R"([{"id": "rs-1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
                      {"id": "fc-1", "type": "function_call", "call_id": "c1", "name": "calculate", "arguments": "{}"}])"));
  auto refs = responses_to_chat(parse(R"({"input": [{"role": "user", "content": "first"},
    {"type": "item_reference", "id": "rs-1"}, {"type": "item_reference", "id": "fc-1"},
    {"type": "function_call_output", "call_id": "c1", "output": "4183"}]})"), &store);
  ASSERT_TRUE(refs.is_ok()) << refs.status().message();
  const Json& m = refs->chat_body["messages"];
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1]["reasoning_content"], "think");
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(m[2]["role"], "tool");
  auto prev = responses_to_chat(parse(R"({"previous_response_id": "resp-1",
    "input": [{"type": "function_call_output", "call_id": "c1", "output": "4183"}]})"), &store);
  ASSERT_TRUE(prev.is_ok()) << prev.status().message();
  EXPECT_EQ(prev->chat_body["messages"], m);  // the same conversation either way
  EXPECT_EQ(prev->input_items.size(), 4u);
  auto missing = responses_to_chat(parse(R"({"input": [{"type": "item_reference", "id": "rs-9"}]})"), &store);
  EXPECT_EQ(error_of(missing.status()).rfind("input[0].id: no stored item 'rs-9'", 0), 0u);
  auto gone = responses_to_chat(parse(R"({"previous_response_id": "resp-9", "input": "x"})"), &store);
  EXPECT_NE(error_of(gone.status()).find("Previous response with id 'resp-9' not found."), std::string::npos);
}

TEST(ResponseStore, BoundedByCountAndBytesLeastRecentlyUsedFirst) {
  ResponseStore store(2, 1 << 20);
  auto item = [](const std::string& id) { return Json::array({Json{{"id", id}, {"type", "message"}}}); };
  store.put("a", Json::array(), item("a-1"));
  store.put("b", Json::array(), item("b-1"));
  ASSERT_TRUE(store.conversation("a"));  // a is now the most recent
  store.put("c", Json::array(), item("c-1"));
  EXPECT_EQ(store.size(), 2u);
  EXPECT_FALSE(store.conversation("b"));
  EXPECT_FALSE(store.item("b-1"));
  EXPECT_TRUE(store.item("a-1"));
  EXPECT_TRUE(store.item("c-1"));
  ResponseStore small(100, 200);
  small.put("x", Json::array(), Json::array({Json{{"id", "x-1"}, {"text", std::string(120, 'x')}}}));
  small.put("y", Json::array(), Json::array({Json{{"id", "y-1"}, {"text", std::string(120, 'y')}}}));
  EXPECT_EQ(small.size(), 1u);
  EXPECT_LE(small.bytes(), 200u);
  EXPECT_TRUE(small.item("y-1"));
  small.put("huge", Json::array(), Json::array({Json{{"text", std::string(500, 'h')}}}));
  EXPECT_FALSE(small.conversation("huge"));  // larger than the whole store: not kept
}

}  // namespace
}  // namespace moonrun::server
