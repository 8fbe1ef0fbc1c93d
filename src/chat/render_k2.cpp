// Kimi K2 / Kimi Linear rendering, as the Kimi-K2-Thinking chat template renders:
//   [<|im_system|>tool_declare<|im_middle|>TOOLS_JSON<|im_end|>]        when tools
//   [<|im_system|>system<|im_middle|>You are Kimi, ...<|im_end|>]       unless a system message leads
//   per message: <|im_user|>|<|im_assistant|>|<|im_system|> NAME <|im_middle|> BODY <|im_end|>
//   <|im_assistant|>assistant<|im_middle|>                               the generation prompt
// Assistant bodies are <think>REASONING</think>CONTENT[<|tool_calls_section_begin|>...]; the
// reasoning is kept only after the last assistant message without tool calls (earlier turns
// get an empty <think></think>), as the template splits history from the current turn.
// Tool results read "## Return of CALL_ID\nCONTENT". JSON is Python's json.dumps with
// default separators and the client's key order (the template's tojson).
#include "chat/render_k2.h"

namespace moonrun::chat {
namespace {

class K2Writer {
 public:
  void text(std::string_view s) {
    if (!s.empty()) out_.push_back({std::string(s), false});
  }
  void special(std::string_view s) { out_.push_back({std::string(s), true}); }

  void content(const Content& c) {
    if (c.kind == Content::Kind::kText) {
      text(c.text);
      return;
    }
    for (const auto& part : c.parts) {
      if (part.kind == ContentPart::Kind::kImage) {
        special("<|media_start|>");
        text("image");
        special("<|media_content|>");
        special("<|media_pad|>");
        special("<|media_end|>");
        text("\n");  // the template leaves this line break after each image
      } else {
        text(part.text);
      }
    }
  }

  std::vector<Segment> take() { return std::move(out_); }

 private:
  std::vector<Segment> out_;
};

const char* role_token(Role role) {
  switch (role) {
    case Role::kUser: return "<|im_user|>";
    case Role::kAssistant: return "<|im_assistant|>";
    default: return "<|im_system|>";
  }
}

}  // namespace

Result<std::vector<Segment>> render_k2(const ChatRequest& request, const RenderOptions& options) {
  K2Writer w;
  const auto& messages = request.messages;

  // The last assistant message without tool calls ends the "history": reasoning before it
  // and including it is dropped.
  long history_end = -1;
  for (long i = static_cast<long>(messages.size()) - 1; i >= 0; --i) {
    if (messages[i].role == Role::kAssistant && messages[i].tool_calls.empty()) {
      history_end = i;
      break;
    }
  }

  if (request.tools.is_array() && !request.tools.empty()) {
    w.special("<|im_system|>");
    w.text("tool_declare");
    w.special("<|im_middle|>");
    w.text(py_json_dumps(request.tools, JsonSeparators::kPythonDefault));
    w.special("<|im_end|>");
  }
  // Only a leading `system` message replaces the default one; a `developer` message is a
  // system-token message named "developer" (the template prints message['role']).
  if (messages.empty() || messages[0].role != Role::kSystem) {
    w.special("<|im_system|>");
    w.text("system");
    w.special("<|im_middle|>");
    w.text("You are Kimi, an AI assistant created by Moonshot AI.");
    w.special("<|im_end|>");
  }

  int synthesized_ids = 0;  // calls without an id get functions.NAME:N
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    const std::string role = role_name(m.role);
    w.special(role_token(m.role));
    w.text(m.name && !m.name->empty() ? *m.name : role);
    w.special("<|im_middle|>");
    if (m.role == Role::kAssistant) {
      w.special("<think>");
      if (static_cast<long>(i) > history_end && m.reasoning) w.text(*m.reasoning);
      w.special("</think>");
      w.content(m.content);
      if (!m.tool_calls.empty()) {
        w.special("<|tool_calls_section_begin|>");
        for (const ToolCall& tc : m.tool_calls) {
          w.special("<|tool_call_begin|>");
          w.text(tc.id ? *tc.id : "functions." + tc.name + ":" + std::to_string(synthesized_ids++));
          w.special("<|tool_call_argument_begin|>");
          if (tc.arguments.is_string()) w.text(tc.arguments.get<std::string>());
          else if (tc.arguments.is_null()) w.text("{}");
          else w.text(py_json_dumps(tc.arguments, JsonSeparators::kPythonDefault));
          w.special("<|tool_call_end|>");
        }
        w.special("<|tool_calls_section_end|>");
      }
    } else if (m.role == Role::kTool) {
      w.text("## Return of " + m.tool_call_id.value_or("") + "\n");
      w.content(m.content);
    } else {
      w.content(m.content);
    }
    w.special("<|im_end|>");
  }
  if (options.add_generation_prompt && request.add_generation_prompt) {
    w.special("<|im_assistant|>");
    w.text("assistant");
    w.special("<|im_middle|>");
  }
  return w.take();
}

}  // namespace moonrun::chat
