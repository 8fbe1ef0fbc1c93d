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
//   tools (type namespace)       flattened: each function tool inside becomes a chat tool
//                                of its own name (two tools of one name are a 400); calls
//                                to it come back with `namespace` set
//   hosted tools                 web_search*, file_search, code_interpreter, computer*,
//                                image_generation, mcp, local_shell, shell, apply_patch,
//                                tool_search: not shown to the model (nothing here runs
//                                them) and named in `dropped_tools`, which the handler sends
//                                as a warning header; Codex sends web_search on every turn
//   text.format                  response_format (json_schema: name, schema, strict)
//   reasoning.effort             reasoning_effort ("none" turns thinking off)
//   max_output_tokens            max_tokens; temperature, top_p, top_k, seed, stop as given
//   previous_response_id         the stored response's conversation comes first
//   item_reference items         the stored item of that id, in its place
//   store                        (default true) whether the response is kept for those
// What cannot be served is a 400 naming the field: conversation, prompt, background, custom
// tools, images outside user messages, n.
#include <map>
#include <string>
#include <vector>

#include "chat/render_json.h"
#include "common/status.h"
#include "server/response_store.h"

namespace moonrun::server {

struct ResponsesRequest {
  chat::Json chat_body;  // the equivalent chat-completions body
  bool stream = false;
  std::string instructions;  // echoed in the response object
  chat::Json tools;          // as given (the response echoes them)
  chat::Json tool_choice;
  chat::Json text_format;
  std::string reasoning_effort;
  chat::Json reasoning_summary;  // reasoning.summary as given (echoed), null when absent
  // The whole conversation as items (previous response first, references resolved): what
  // the store keeps with the output when `store` is true.
  chat::Json input_items = chat::Json::array();
  bool store = true;
  std::string previous_response_id;
  std::map<std::string, std::string> tool_namespace;  // flattened tool name -> its namespace
  std::vector<std::string> dropped_tools;              // "tools[8] (web_search)", ...
};

// store: where previous_response_id and item_reference are looked up (null: nothing is).
Result<ResponsesRequest> responses_to_chat(const chat::Json& body, ResponseStore* store);

}  // namespace moonrun::server
