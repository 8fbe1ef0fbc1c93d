#pragma once
// An OpenAI Responses API request (POST /v1/responses) as the chat body the chat pipeline
// runs, so that both APIs render, constrain and parse alike. The mapping (vLLM's
// Responses serving does the same):
//   instructions                 a system message first
//   input: string                one user message
//   input items                  messages by role (input_text / output_text parts);
//                                reasoning items become the next assistant message's
//                                reasoning_content; function_call items its tool_calls
//                                (call_id as the id); function_call_output items tool
//                                messages answering call_id
//   tools (type function)        chat tools; tool_choice, parallel_tool_calls as given
//   text.format                  response_format (json_schema: name, schema, strict)
//   reasoning.effort             reasoning_effort ("none" turns thinking off)
//   max_output_tokens            max_tokens; temperature, top_p, top_k, seed, stop as given
// What cannot be served is a 400 naming the field: previous_response_id (nothing is
// stored), built-in tools (web_search, file_search, ...), images, n.
#include <string>

#include "chat/render_json.h"
#include "common/status.h"

namespace moonrun::server {

struct ResponsesRequest {
  chat::Json chat_body;  // the equivalent chat-completions body
  bool stream = false;
  std::string instructions;  // echoed in the response object
  chat::Json tools;          // as given (the response echoes them)
  chat::Json tool_choice;
  chat::Json text_format;
  std::string reasoning_effort;
};

Result<ResponsesRequest> responses_to_chat(const chat::Json& body);

}  // namespace moonrun::server
