#pragma once
// An Anthropic Messages API request (POST /v1/messages) as the chat body the chat pipeline
// runs. The mapping:
//   system (string or text blocks)   a system message first
//   user text blocks                 a user message; tool_result blocks become tool
//                                    messages (before the user's text) answering tool_use_id
//   assistant blocks                 thinking -> reasoning_content, text -> content,
//                                    tool_use -> tool_calls (id kept, input as arguments)
//   tools (name, input_schema)       chat tools; tool_choice auto/any/tool/none ->
//                                    auto/required/named/none; disable_parallel_tool_use ->
//                                    parallel_tool_calls false
//   thinking {type: disabled}        thinking off (K3 thinks unless told not to)
//   max_tokens (required), stop_sequences, temperature, top_p, top_k
// Images, documents and server tools are 400s naming the block.
#include <string>
#include <vector>

#include "chat/render_json.h"
#include "common/status.h"

namespace moonrun::server {

struct MessagesRequest {
  chat::Json chat_body;
  bool stream = false;
  std::vector<std::string> stop_sequences;  // to report which one matched
};

Result<MessagesRequest> messages_to_chat(const chat::Json& body);

}  // namespace moonrun::server
