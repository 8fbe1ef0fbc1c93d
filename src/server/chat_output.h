#pragma once
// The assistant completion, parsed as it streams: reasoning, content and tool calls, in the
// checkpoint's chat format (K3 XTML or K2). A thin adapter over chat/parse_*.h so the
// handlers depend on one small interface.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/parse_message.h"
#include "chat/render_chat.h"

namespace moonrun::server {

struct ToolCallOut {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallOut> tool_calls;  // each call once, when it closed
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  virtual ~ChatOutputParser() = default;
  virtual ParsedDelta feed(std::string_view text) = 0;
  virtual ParsedDelta finish() = 0;       // end of generation: flush what was held back
  virtual bool in_reasoning() const = 0;  // the next text would count as reasoning
};

// options: what the request implies (chat::parse_options_for): thinking (the generation
// prompt opened the think channel, else the response channel), tools, tool_choice.
std::unique_ptr<ChatOutputParser> make_chat_output_parser(chat::ChatFormat format,
                                                          const chat::ParseOptions& options);

}  // namespace moonrun::server
