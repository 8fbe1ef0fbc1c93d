#pragma once
// Route handlers. Each returns the JSON body and HTTP status, or streams through the sink.
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_error.h"
#include "server/serving_context.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace moonrun::server {

// Writes an error envelope with its status.
void send_error(httplib::Response& res, const ApiError& error);

// Parses the body as JSON (400 "invalid JSON" envelope on failure) and checks `model`.
bool parse_body(const ServingContext& ctx, const httplib::Request& req, httplib::Response& res,
                nlohmann::json& body);

void handle_chat_completions(const ServingContext& ctx, const httplib::Request& req,
                             httplib::Response& res);
void handle_completions(const ServingContext& ctx, const httplib::Request& req,
                        httplib::Response& res);
// The OpenAI Responses API and the Anthropic Messages API on the chat pipeline.
void handle_responses(const ServingContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_messages(const ServingContext& ctx, const httplib::Request& req, httplib::Response& res);

// A liveness check of the client behind req (see client_connection.h) for a non-streaming
// Generation::collect (streams notice through their writes); nullptr when its connection
// could not be found (nothing is known).
std::function<bool()> client_gone_check(const httplib::Request& req);
// The response for a failed Generation::collect: the engine's error as a 500, or, when the
// client went away, 499 (nginx's "client closed request"; for the log: nobody reads it).
void send_collect_error(httplib::Response& res, const Status& status, bool client_gone);

// "chatcmpl-<hex>" / "cmpl-<hex>": unique per process run.
std::string new_response_id(const char* prefix);
int64_t unix_time_s();
// The prompt must leave room for at least one token; max_tokens defaults to what is left.
Status fit_context(const ServingContext& ctx, size_t prompt_tokens, int& max_tokens);
std::string sse_data(const nlohmann::json& chunk);

}  // namespace moonrun::server
