#pragma once
// An Anthropic Messages API request (POST /v1/messages, /v1/messages/count_tokens) as the
// chat body the chat pipeline runs. What Claude Code 2.1 and the Anthropic SDKs send is all
// taken; the mapping:
//   system (string or text blocks)   a system message first
//   system turns inside messages     system messages where they stand (Claude Code sends its
//                                    environment block as one, after the first user turn)
//   user text blocks                 a user message; tool_result blocks become tool
//                                    messages (before the user's text) answering tool_use_id;
//                                    a tool_result's tool_reference blocks declare those
//                                    deferred tools from there on (K3's "New Tools Available")
//   assistant blocks                 thinking -> reasoning_content (from the signature when
//                                    the text was omitted), text -> content, tool_use ->
//                                    tool_calls (id kept, input as arguments)
//   tools (name, input_schema)       chat tools; defer_loading tools are not shown to the
//                                    model until a tool_reference names them (Anthropic's
//                                    meaning of deferred); tool_choice auto/any/tool/none ->
//                                    auto/required/named/none; disable_parallel_tool_use ->
//                                    parallel_tool_calls false
//   thinking enabled | adaptive      thinking on (K3 thinks unless told not to; budget_tokens
//                                    has no K3 counterpart); disabled: off; display "omitted"
//                                    returns the thinking in the signature only
//   output_config.effort             reasoning effort: low -> low, medium and high -> high,
//                                    xhigh and max -> max (K3 knows low, high, max)
//   output_config.format / output_format  {type: json_schema, schema}: response_format,
//                                    enforced by the token mask as on the chat route
//   context_management               accepted; no edit is ever needed (the server keeps no
//                                    context between requests), so applied_edits is empty
//   max_tokens (required), stop_sequences, temperature, top_p, top_k; cache_control,
//   metadata, service_tier and the other annotations are accepted and ignored.
// Anthropic's server tools (web search, code execution, ...), documents and images outside
// user messages are 400s naming the block: nothing here can run or read them.
#include <string>
#include <vector>

#include "chat/render_json.h"
#include "common/status.h"

namespace moonrun::server {

struct MessagesRequest {
  chat::Json chat_body;
  bool stream = false;
  std::vector<std::string> stop_sequences;  // to report which one matched
  // thinking.display "omitted": thinking blocks carry an empty text, the reasoning only in
  // their signature (which comes back with the conversation and is read back here).
  bool thinking_omitted = false;
  bool context_management = false;  // asked for: the reply says which edits were applied (none)
};

enum class MessagesRoute { kCreate, kCountTokens };

// kCountTokens: the same body without max_tokens (count_tokens takes none).
Result<MessagesRequest> messages_to_chat(const chat::Json& body, MessagesRoute route = MessagesRoute::kCreate);

// A thinking block's signature: the reasoning itself, so a client that was sent the block
// without its text (display "omitted") hands the reasoning back with the block. Nothing is
// signed: this server has nothing to verify.
std::string thinking_signature(const std::string& reasoning);

// Anthropic's texts for a prompt that does not fit the context; Claude Code reads the
// second one's numbers and retries with a max_tokens that fits. Same contract as
// fit_context (handlers.h).
Status anthropic_fit_context(int64_t max_model_len, size_t prompt_tokens, int& max_tokens);

}  // namespace moonrun::server
