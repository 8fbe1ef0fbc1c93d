#pragma once
// Anthropic's error envelope, for every answer on the Anthropic routes (/v1/messages and
// everything under it, 404s included): {"type": "error", "error": {"type", "message"}} with
// the HTTP status and error type Anthropic's API uses for each kind of failure:
//   400 invalid_request_error, 401 authentication_error, 403 permission_error,
//   404 not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error,
//   529 overloaded_error.
// moonrun's 503s (at capacity, shutting down, engine not running) are Anthropic's 529: the
// status its clients (Claude Code, @anthropic-ai/sdk) retry with backoff, as they do a 503
// from OpenAI's API. Clients branch on these types and on a few message texts (Claude Code
// shrinks max_tokens on "input length and `max_tokens` exceed context limit: ..."), so the
// texts that matter are Anthropic's own (messages_request.h: context_limit_error).
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/http_types.h"
#include "server/openai_error.h"

namespace moonrun::server {

// "/v1/messages" and every path under it ("/v1/messages/count_tokens", "/v1/messages/batches").
bool is_anthropic_route(std::string_view path);

// The status Anthropic's API answers for a failure moonrun answers with `http_status`.
int anthropic_status(int http_status);
const char* anthropic_error_type(int anthropic_http_status);

nlohmann::json anthropic_error_json(const ApiError& error);
// Writes the envelope with Anthropic's status (529s carry Retry-After, as 503s do).
void send_anthropic_error(HttpResponse& res, const ApiError& error);

}  // namespace moonrun::server
