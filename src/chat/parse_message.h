#pragma once
// From an assistant completion (the text generated after the generation prompt, through
// the end marker) back to an OpenAI message: reasoning_content, content, tool_calls.
//
// Parsers are streaming state machines: feed() takes any chunk of text (a token's worth,
// or the whole completion) and returns what became certain, finish() flushes the rest.
// Parsing a whole text is feed(text) + finish(), so the streamed deltas always add up to
// the non-streamed message. Reasoning and content stream as they arrive, a tool call comes
// out whole when its closing marker arrives, and text that may still turn out to be a
// marker is held back so no piece of a marker ever reaches content.
//
// Malformed output never fails and never leaks markup, as the peers (vLLM, SGLang,
// llama.cpp) parse it: a marker or tag that does not fit where it appears is dropped, and
// so is a half-written one at the end of a cut-off stream; a tool call that never closes,
// or has no name, is dropped; text the format puts nowhere (between calls, after the tool
// section, after the end marker) is dropped; a typed argument that is not valid JSON keeps
// its raw text as a string.
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "chat/render_chat.h"
#include "chat/render_json.h"

namespace moonrun::chat {

struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object as text
  bool operator==(const ParsedToolCall&) const = default;
};

struct ParseDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;  // complete calls, in order
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct ParsedMessage {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  void append(const ParseDelta& delta);
  // {"reasoning_content": str|null, "content": str|null,
  //  "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}
  Json to_json() const;
};

// Tool-call ids as vLLM gives K3 calls: "chatcmpl-tool-" + 32 random hex digits. A fixed
// seed makes them reproducible (tests, `moonrun parse`).
class ToolCallIds {
 public:
  explicit ToolCallIds(std::optional<uint64_t> seed);
  std::string next();

 private:
  std::mt19937_64 rng_;
};

// A tool the request declared, as far as the parsers need it: K2 calls whose id does not
// name the function (a bare counter "0", a client's id "call_3") are matched to a declared
// tool by their argument keys.
struct DeclaredTool {
  std::string name;
  std::vector<std::string> properties;  // parameters.properties keys
};

struct ParseOptions {
  bool thinking = true;             // the generation prompt opened the think channel
  std::optional<uint64_t> id_seed;  // unset: random ids
  // The request's tool settings: no calls when it declared no tools or said
  // tool_choice "none" (the tool channel is still parsed, and dropped); at most one call
  // with parallel_tool_calls false. Without a request (moonrun parse alone): all calls.
  bool tool_calls_allowed = true;
  bool parallel_tool_calls = true;
  std::vector<DeclaredTool> tools;  // empty: unknown (K2 calls without a name are dropped)
};

// The parse options a chat request implies (thinking, tools, tool_choice, parallel calls).
struct ChatRequest;
ParseOptions parse_options_for(const ChatRequest& request);

class CompletionParser {
 public:
  virtual ~CompletionParser() = default;
  virtual ParseDelta feed(std::string_view text) = 0;
  virtual ParseDelta finish() = 0;
};

std::unique_ptr<CompletionParser> make_completion_parser(ChatFormat format, const ParseOptions& options);

// feed(text) + finish() on a fresh parser.
ParsedMessage parse_completion(ChatFormat format, std::string_view text, const ParseOptions& options);

}  // namespace moonrun::chat
