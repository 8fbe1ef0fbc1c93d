#pragma once
// An OpenAI chat-completions request, typed. This is the one place where a request body is
// understood: the CLI (`moonrun render`) and the server both call parse_chat_request, and
// every later stage (renderers, sampler set-up, parsers) reads these structs, never the raw
// JSON. Errors are values whose message names the field:
//   "messages[2].role: unknown role 'robot'".
//
// A few fields stay JSON on purpose, because the chat format prints them back byte for
// byte (tool declarations, tool-call arguments, JSON schemas): they are kept as
// nlohmann::ordered_json so that the order the client wrote is the order rendered.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/render_json.h"
#include "common/status.h"

namespace moonrun::chat {

enum class Role { kSystem, kDeveloper, kUser, kAssistant, kTool };
const char* role_name(Role role);

struct ContentPart {
  enum class Kind { kText, kImage };  // "text"; "image_url" or "image"
  Kind kind = Kind::kText;
  std::string text;       // kText
  std::string image_url;  // kImage: the url (http(s) or data:), as given
};

// `content` is a string, an array of parts, or absent/null; the three render differently.
struct Content {
  enum class Kind { kNull, kText, kParts };
  Kind kind = Kind::kNull;
  std::string text;                // kText
  std::vector<ContentPart> parts;  // kParts
  int num_images() const;
};

struct ToolCall {
  std::optional<std::string> id;
  std::string name;
  // As the client sent it: normally a string holding a JSON object; an object, or null,
  // is accepted too (the K3 reference accepts both).
  Json arguments;
};

struct Message {
  Role role = Role::kUser;
  std::optional<std::string> name;
  Content content;
  // Assistant: `reasoning_content`, else `reasoning` (the newer vLLM name): the first one
  // that is a non-empty string. Rendered back as preserved thinking.
  std::optional<std::string> reasoning;
  std::vector<ToolCall> tool_calls;        // assistant
  std::optional<std::string> tool_call_id; // tool
  // Tool: the tool's name from `name` (a `tool` key is ignored, as vLLM ignores it).
  std::optional<std::string> tool_name;
  // System: tools declared mid-conversation (K3 "New Tools Available"); null when absent.
  Json tools;
};

struct ToolChoice {
  enum class Kind { kAuto, kNone, kRequired, kNamed };
  Kind kind = Kind::kAuto;
  std::string function_name;  // kNamed
};

struct ResponseFormat {
  enum class Kind { kText, kJsonObject, kJsonSchema };
  Kind kind = Kind::kText;
  Json json_schema;  // kJsonSchema: the object under "json_schema" (name, schema, strict)
};

struct ChatRequest {
  std::string model;
  std::vector<Message> messages;
  Json tools;  // the `tools` array as given (null when absent); names checked
  ToolChoice tool_choice;
  ResponseFormat response_format;

  // Thinking: on unless chat_template_kwargs {"thinking": false} / {"enable_thinking":
  // false}, or `reasoning_effort: "none"` (the kwargs win, as in vLLM's K3 renderer).
  // Effort: chat_template_kwargs.thinking_effort, else reasoning_effort, else "max" (the
  // K3 tokenizer's default). The K3 encoder accepts only low|high|max and rejects anything
  // else (render_k3 returns the 400, naming thinking_effort_field); K2 has no effort.
  bool thinking = true;
  std::string thinking_effort = "max";
  std::string thinking_effort_field = "reasoning_effort";  // where the value came from
  // chat_template_kwargs.add_generation_prompt (default true): false ends the prompt after
  // the last message, as the reference renderers do.
  bool add_generation_prompt = true;
  bool parallel_tool_calls = true;    // false: at most one tool call per reply
  std::vector<std::string> warnings;  // for the server's log

  // Sampling and transport.
  bool stream = false;
  bool include_usage = false;                 // stream_options.include_usage
  std::optional<int64_t> max_tokens;          // max_completion_tokens, else max_tokens
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  int64_t n = 1;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  bool logprobs = false;
  std::optional<int64_t> top_logprobs;
};

// `body` is the parsed request JSON (parse it with Json::parse so object order is kept).
Result<ChatRequest> parse_chat_request(const Json& body);
// Parses the text first; a syntax error reads "request: invalid JSON: <detail>".
Result<ChatRequest> parse_chat_request_text(std::string_view body);

}  // namespace moonrun::chat
