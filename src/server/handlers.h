#pragma once
// Route handlers and what they share. A handler fills the response (or sets its stream) on
// the worker thread the server gives it; see http_types.h.
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/http_types.h"
#include "server/openai_error.h"
#include "server/request_json.h"
#include "server/serving_context.h"

namespace moonrun::server {

// Writes an error envelope with its status (503s carry Retry-After).
void send_error(HttpResponse& res, const ApiError& error);

// Parses the body as JSON (400 envelope when invalid or nested too deep) and checks `model`
// against the names the server answers to (404 model_not_found otherwise).
bool parse_body(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res, nlohmann::json& body);

void handle_chat_completions(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_completions(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res);
// The OpenAI Responses API and the Anthropic Messages API on the chat pipeline.
void handle_responses(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_messages(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res);
// POST /v1/messages/count_tokens: the prompt tokens a Messages request would take.
void handle_count_tokens(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res);

// The liveness check of the client behind req for a non-streaming Generation::collect
// (streams notice through their writes).
std::function<bool()> client_gone_check(const HttpRequest& req);
// The response for a failed Generation::collect: 499 when the client went away (nginx's
// "client closed request"; for the log: nobody reads it), 503 when the shutdown deadline
// cut it, else the engine's error (500).
void send_collect_error(HttpResponse& res, const Status& status, bool client_gone);

// "chatcmpl-<hex>" / "cmpl-<hex>": unique per process run.
std::string new_response_id(const char* prefix);
int64_t unix_time_s();
// The prompt must leave room for at least one token; max_tokens defaults to what is left.
Status fit_context(const ServingContext& ctx, size_t prompt_tokens, int& max_tokens);
std::string sse_data(const nlohmann::json& chunk);
// A named SSE event, "event: <chunk.type>" then its data (the Responses and Messages streams).
std::string sse_event(const nlohmann::json& chunk);

}  // namespace moonrun::server
