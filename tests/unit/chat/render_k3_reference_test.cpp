// Issue 48: thinking off and `developer` messages, rendered as Moonshot's K3 encoder renders
// them. Every expected string below was printed by the reference itself, `encoding_k3.py`
// (vllm-project/llm-compressor, src/llmcompressor/modeling/kimi_k3/, commit b6dd6de83, the
// copy of the file shipped with the checkpoint), called as the checkpoint's tokenizer calls
// it (tokenization_kimi.py `apply_chat_template`, which defaults thinking_effort to "max",
// line 398) with the request's kwargs mapped as vLLM's K3 renderer maps them
// (_apply_k3_thinking_kwargs: enable_thinking -> thinking, reasoning_effort -> thinking_effort).
// None of them comes from moonrun's renderer.
//
// What the reference does, line by line (encoding_k3.py at b6dd6de83):
// - 521-536: the thinking-effort system message only when `thinking` is on; with thinking
//   off no effort is rendered (nor checked), whatever effort the request names;
// - 419-424: with thinking off an assistant's history has no think channel at all (its
//   reasoning is dropped); 648: the generation prompt opens `response`, not `think`;
// - 538-600: roles user, system, tool, assistant; there is no branch for `developer`, so the
//   encoder alone would leave such a message out. vLLM's K3 renderer hands it over as a
//   `system` message in its place (_convert_developer_to_system) and moonrun does the same:
//   the format's only label for instructions is role="system", and leaving the developer's
//   instructions out of the prompt would lose them.
#include <gtest/gtest.h>

#include "chat/chat_request.h"
#include "chat/render_chat.h"

namespace moonrun::chat {
namespace {

std::string render(const std::string& body) {
  auto req = parse_chat_request_text(body);
  EXPECT_TRUE(req.is_ok()) << req.status().message();
  if (!req.is_ok()) return "";
  auto segments = render_chat(ChatFormat::kKimiK3, *req);
  EXPECT_TRUE(segments.is_ok()) << segments.status().message();
  return segments.is_ok() ? join_segments(*segments) : "";
}

const std::string kHistory = R"("messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
  {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}, {"role": "user", "content": "Bye"}])";

// encoding_k3.build_chat_segments(history, thinking=False, thinking_effort="high")
const std::string kThinkingOff =
    "<|open|>message role=\"system\"<|sep|>Be brief.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>Hello<|close|>response<|sep|><|close|>message<|sep|>"
    "<|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>Bye<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";

TEST(RenderK3Reference, EnableThinkingFalseRendersNoEffortMessage) {
  EXPECT_EQ(render("{" + kHistory + R"(, "chat_template_kwargs": {"enable_thinking": false}})"), kThinkingOff);
  // An effort named beside it changes nothing: the reference looks at it only when thinking.
  EXPECT_EQ(render("{" + kHistory + R"(, "reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": false}})"),
            kThinkingOff);
  EXPECT_EQ(render("{" + kHistory + R"(, "chat_template_kwargs": {"enable_thinking": false, "thinking_effort": "low"}})"),
            kThinkingOff);
  // The K3 names for the same switch.
  EXPECT_EQ(render("{" + kHistory + R"(, "chat_template_kwargs": {"thinking": false}})"), kThinkingOff);
  EXPECT_EQ(render("{" + kHistory + R"(, "reasoning_effort": "none"})"), kThinkingOff);
}

TEST(RenderK3Reference, ThinkingOnRendersTheEffortMessageFirst) {
  // encoding_k3.build_chat_segments(history, thinking=True, thinking_effort="high"): the
  // effort message comes before every message of the conversation, the client's system one
  // included; the history keeps its think channel; the prompt opens `think`.
  const std::string want =
      "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to think in "
      "your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, "
      "and `max`.\nNow the system is invoked with `thinking_effort=high`.<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"system\"<|sep|>Be brief.<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>greet<|close|>think<|sep|><|open|>response<|sep|>"
      "Hello<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"user\"<|sep|>Bye<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
  EXPECT_EQ(render("{" + kHistory + R"(, "reasoning_effort": "high"})"), want);
  EXPECT_EQ(render("{" + kHistory + R"(, "chat_template_kwargs": {"enable_thinking": true, "thinking_effort": "high"}})"),
            want);
}

const std::string kDeveloper = R"("messages": [{"role": "user", "content": "Hi"},
  {"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Bye"}])";

TEST(RenderK3Reference, DeveloperMessageIsASystemMessageInItsPlace) {
  // encoding_k3.build_chat_segments(developer -> system, thinking=True, thinking_effort="max"):
  // labelled role="system" (no type), where the client put it: after the effort message
  // and the first user turn, not moved to the front.
  EXPECT_EQ(render("{" + kDeveloper + "}"),
            "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to "
            "think in your thinking channel (not including the response channel), supported values include `low`, "
            "`medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=max`.<|close|>message<|sep|>"
            "<|end_of_msg|>"
            "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"system\"<|sep|>Answer in French.<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"user\"<|sep|>Bye<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
  // The same with thinking off: no effort message, the prompt opens `response`.
  EXPECT_EQ(render("{" + kDeveloper + R"(, "chat_template_kwargs": {"enable_thinking": false}})"),
            "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"system\"<|sep|>Answer in French.<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"user\"<|sep|>Bye<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>");
}

}  // namespace
}  // namespace moonrun::chat
