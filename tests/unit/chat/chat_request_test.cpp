// Request parsing: typed fields, thinking resolution, and one-line errors naming the field.
#include <gtest/gtest.h>

#include "chat/chat_request.h"

namespace moonrun::chat {
namespace {

std::string error_of(const std::string& body) {
  auto r = parse_chat_request_text(body);
  return r.is_ok() ? "(ok)" : r.status().message();
}

TEST(ChatRequest, ErrorsNameTheField) {
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"robot","content":"c"}]})"),
            "messages[2].role: unknown role 'robot' (system, developer, user, assistant, tool)");
  EXPECT_EQ(error_of(R"({})"), "messages: missing");
  EXPECT_EQ(error_of(R"({"messages":[]})"), "messages: must contain at least one message");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":5}]})"),
            "messages[0].content: expected a string, an array of content parts, or null, got a number");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":[{"type":"audio"}]}]})"),
            "messages[0].content[0].type: unknown content part type 'audio' (text, image_url)");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]})"),
            "messages[0].tool_calls[0].function.name: expected a string");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})"),
            "tool_choice: unknown value 'sometimes' (auto, none, required, or a named function)");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],)"
                     R"("tool_choice":{"type":"function","function":{"name":"g"}}})"),
            "tool_choice.function.name: 'g' is not one of the request's tools");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}})"),
            "response_format.type: unknown type 'yaml' (text, json_object, json_schema)");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})"),
            "temperature: expected a number, got a string");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]})"),
            "tools[0].function.name: expected a non-empty string");
  EXPECT_EQ(error_of("{\"messages\": ["), error_of("{\"messages\": [")); // stable
  EXPECT_EQ(error_of("{\"messages\": [").rfind("request: invalid JSON:", 0), 0u);
}

TEST(ChatRequest, ThinkingAndEffort) {
  auto r = parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->thinking);
  EXPECT_EQ(r->thinking_effort, "max");  // the K3 tokenizer's default

  r = parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"low"})");
  EXPECT_EQ(r->thinking_effort, "low");
  r = parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"none"})");
  EXPECT_FALSE(r->thinking);
  // Any other effort is kept as given: the K3 encoder refuses it (render_k3's 400, which
  // names the field it came from; see the render fixtures), K2 has no effort at all.
  r = parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"medium"})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->thinking);
  EXPECT_EQ(r->thinking_effort, "medium");
  EXPECT_EQ(r->thinking_effort_field, "reasoning_effort");
  r = parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false}})");
  EXPECT_FALSE(r->thinking);
  // chat_template_kwargs: thinking_effort wins over reasoning_effort, thinking over "none";
  // add_generation_prompt is read.
  r = parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"none",
      "chat_template_kwargs":{"thinking":true,"thinking_effort":"low","add_generation_prompt":false}})");
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->thinking);
  EXPECT_EQ(r->thinking_effort, "low");
  EXPECT_EQ(r->thinking_effort_field, "chat_template_kwargs.thinking_effort");
  EXPECT_FALSE(r->add_generation_prompt);
  EXPECT_EQ(parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"add_generation_prompt":1}})")
                .status().message(),
            "chat_template_kwargs.add_generation_prompt: expected a boolean, got a number");
}

TEST(ChatRequest, TypedPieces) {
  auto r = parse_chat_request_text(R"({
    "model": "k3", "stream": true, "stream_options": {"include_usage": true}, "max_completion_tokens": 64,
    "max_tokens": 9, "stop": "END", "seed": 7, "n": 2,
    "messages": [
      {"role": "user", "name": "ann", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:,"}}]},
      {"role": "assistant", "content": null, "reasoning_content": "", "reasoning": "thought",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": 2}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "r"}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->model, "k3");
  EXPECT_TRUE(r->stream && r->include_usage);
  EXPECT_EQ(*r->max_tokens, 64);  // max_completion_tokens wins
  EXPECT_EQ(r->stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r->n, 2);
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(*r->messages[0].name, "ann");
  EXPECT_EQ(r->messages[0].content.num_images(), 1);
  EXPECT_EQ(r->messages[0].content.parts[1].image_url, "data:,");
  EXPECT_EQ(*r->messages[1].reasoning, "thought");  // empty reasoning_content falls through
  EXPECT_EQ(r->messages[1].tool_calls[0].arguments.get<std::string>(), "{\"b\": 1, \"a\": 2}");
  EXPECT_EQ(*r->messages[2].tool_call_id, "c1");
  EXPECT_EQ(r->response_format.kind, ResponseFormat::Kind::kJsonSchema);
}

}  // namespace
}  // namespace moonrun::chat
