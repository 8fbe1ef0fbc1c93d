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
// Malformed output never fails and never loses text: a marker that does not fit where it
// appears stays literal text of the channel it is in; a tool call that never closes, or
// has no name, goes to content verbatim; a typed argument that is not valid JSON keeps its
// raw text as a string; text after the end marker is content.
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

struct ParseOptions {
  bool thinking = true;             // the generation prompt opened the think channel
  std::optional<uint64_t> id_seed;  // unset: random ids
};

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
