#include "server/routes.h"

#include "server/chat_pipeline.h"

#include <chrono>
#include <optional>
#include <cstdio>
#include <random>

#include "common/log.h"
#include "server/anthropic_error.h"
#include "server/handlers.h"
#include "server/web_ui.h"

namespace moonrun::server {

using nlohmann::json;

// ---- shared by the handlers (handlers.h) ---------------------------------------------

void send_error(HttpResponse& res, const ApiError& error) {
  res.status = error.http_status;
  res.stream = nullptr;
  res.set_content(error.to_json().dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  // RFC 9110: a 503 says when to come back; clients (and the openai package) honour it.
  if (error.http_status == 503 || error.http_status == 429) res.set_header("Retry-After", "1");
}

std::function<bool()> client_gone_check(const HttpRequest& req) { return req.client_gone; }

void send_collect_error(HttpResponse& res, const Status& status, bool client_gone) {
  if (client_gone)
    return send_error(res, ApiError{499, "The client closed the connection before the response was "
                                         "ready; the request was aborted.",
                                    "invalid_request_error", "", "client_closed_request"});
  if (status.code() == StatusCode::kUnavailable) return send_error(res, shutting_down(status.message()));
  send_error(res, internal(status.message()));
}

std::string new_response_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t run_salt = std::random_device{}() ^ static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%08llx%08llx", prefix,
                static_cast<unsigned long long>(run_salt & 0xffffffffu),
                static_cast<unsigned long long>(++counter));
  return buf;
}

int64_t unix_time_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string sse_data(const json& chunk) {
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string sse_event(const json& chunk) {
  return "event: " + chunk["type"].get<std::string>() + "\n" + sse_data(chunk);
}

Status fit_context(const ServingContext& ctx, size_t prompt_tokens, int& max_tokens) {
  const int64_t limit = ctx.max_model_len;
  if (static_cast<int64_t>(prompt_tokens) >= limit)
    return out_of_range("This model's maximum context length is " + std::to_string(limit) +
                        " tokens. However, your prompt is " + std::to_string(prompt_tokens) +
                        " tokens, which leaves no room for a completion.");
  if (max_tokens < 0) {
    max_tokens = static_cast<int>(limit - static_cast<int64_t>(prompt_tokens));
  } else if (static_cast<int64_t>(prompt_tokens) + max_tokens > limit) {
    return out_of_range("This model's maximum context length is " + std::to_string(limit) +
                        " tokens. However, you requested " + std::to_string(prompt_tokens + max_tokens) + " tokens (" +
                        std::to_string(prompt_tokens) + " in the messages, " + std::to_string(max_tokens) +
                        " in the completion). Please reduce the length of the messages or completion.");
  }
  return Status::ok();
}

bool model_name_matches(const ServingContext& ctx, const std::string& name) {
  // A path may come with or without its trailing slash.
  std::string trimmed = name;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  if (name.empty() || name == ctx.served_model_name || trimmed == ctx.served_model_name) return true;
  for (const auto& n : ctx.model_names)
    if (n == name || n == trimmed) return true;
  return false;
}

bool parse_body(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res, json& body) {
  auto parsed = parse_request_json(req.body);
  if (!parsed.is_ok()) {
    send_error(res, bad_request(parsed.status().message(), "", "invalid_json"));
    return false;
  }
  body = std::move(parsed).value();
  if (!body.is_object()) {
    send_error(res, bad_request("Request body must be a JSON object."));
    return false;
  }
  auto model = json_string(body, "model", "");
  if (!model.is_ok()) {
    send_error(res, bad_request(model.status().message(), "model"));
    return false;
  }
  if (!model_name_matches(ctx, *model)) {
    send_error(res, not_found_error("The model '" + *model + "' does not exist. This server serves '" +
                                        ctx.served_model_name + "'.",
                                    "model", "model_not_found"));
    return false;
  }
  if (auto wrong = check_boolean_fields(body, req.path)) {
    send_error(res, bad_request(wrong->message, wrong->field));
    return false;
  }
  return true;
}

// ---- CORS and auth -------------------------------------------------------------------

namespace {

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Length leaks; content does not.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

bool authorized(const ServingContext& ctx, const HttpRequest& req) {
  const auto& keys = ctx.options.api_keys;
  if (keys.empty()) return true;
  std::string given = req.get_header_value("Authorization");
  if (given.size() > 7 && iequals(std::string_view(given).substr(0, 7), "Bearer ")) given = given.substr(7);
  else given = req.get_header_value("x-api-key");  // Anthropic-style clients
  bool ok = false;
  for (const auto& k : keys) ok |= constant_time_equal(given, k);
  return ok;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Adds the CORS headers for the request's Origin when allowed; returns whether it is.
bool apply_cors(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const std::string origin = req.get_header_value("Origin");
  if (origin.empty()) return false;
  const auto& allowed = ctx.options.allowed_origins;
  bool any = false, match = false;
  for (const auto& o : allowed) {
    if (o == "*") any = true;
    if (o == origin) match = true;
  }
  if (!any && !match) return false;
  res.set_header("Access-Control-Allow-Origin", match ? origin : "*");
  if (match) res.set_header("Vary", "Origin");
  res.set_header("Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
  return true;
}

void preflight(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  res.status = 204;
  if (!apply_cors(ctx, req, res)) return;
  const auto& m = ctx.options.allowed_methods;
  res.set_header("Access-Control-Allow-Methods",
                 m.size() == 1 && m[0] == "*" ? "GET, POST, OPTIONS" : joined(m));
  const auto& h = ctx.options.allowed_headers;
  const std::string asked = req.get_header_value("Access-Control-Request-Headers");
  res.set_header("Access-Control-Allow-Headers",
                 h.size() == 1 && h[0] == "*" ? (asked.empty() ? "Authorization, Content-Type" : asked) : joined(h));
  res.set_header("Access-Control-Max-Age", "600");
}

// ---- the small routes ----------------------------------------------------------------

void health(const ServingContext& ctx, HttpResponse& res, bool draining) {
  const bool ok = ctx.engine && ctx.engine->alive() && !draining;
  res.status = ok ? 200 : 503;
  res.set_content(ok ? "" : draining ? "shutting down" : "engine is not running", "text/plain");
}

void models(const ServingContext& ctx, HttpResponse& res) {
  json root = ctx.options.model_path.empty() ? json(ctx.served_model_name) : json(ctx.options.model_path);
  json data = json::array();
  data.push_back({{"id", ctx.served_model_name}, {"object", "model"}, {"created", ctx.created_unix_s},
                  {"owned_by", "moonrun"}, {"root", root}, {"parent", nullptr}, {"max_model_len", ctx.max_model_len}});
  for (const auto& alias : ctx.options.served_model_aliases)
    data.push_back({{"id", alias}, {"object", "model"}, {"created", ctx.created_unix_s}, {"owned_by", "moonrun"},
                    {"root", root}, {"parent", nullptr}, {"max_model_len", ctx.max_model_len}});
  res.set_content(json{{"object", "list"}, {"data", data}}.dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

void metrics(const ServingContext& ctx, HttpResponse& res) {
  if (ctx.engine && ctx.metrics) {
    EngineStats s = ctx.engine->stats();
    ctx.metrics->set_running(s.num_running);
    ctx.metrics->set_waiting(s.num_waiting);
    ctx.metrics->set_kv_cache_usage(s.cache.usage());
    ctx.metrics->set_kda_slots_used(s.cache.total_slots - s.cache.free_slots);
    ctx.metrics->set_prompt_tokens_total(static_cast<uint64_t>(s.prompt_tokens_total));
    ctx.metrics->set_generation_tokens_total(static_cast<uint64_t>(s.generation_tokens_total));
    ctx.metrics->set_preemptions_total(static_cast<uint64_t>(s.preemptions_total));
    ctx.metrics->set_spec_decode(static_cast<uint64_t>(s.spec_num_drafts_total),
                                 static_cast<uint64_t>(s.spec_draft_tokens_total),
                                 static_cast<uint64_t>(s.spec_accepted_tokens_total),
                                 std::vector<uint64_t>(s.spec_accepted_per_position.begin(),
                                                       s.spec_accepted_per_position.end()));
    ctx.metrics->set_spec_idle_steps(static_cast<uint64_t>(s.spec_stand_aside_steps_total),
                                     static_cast<uint64_t>(s.spec_steps_without_drafts_total));
  }
  res.set_content(ctx.metrics ? ctx.metrics->render() : "", "text/plain; version=0.0.4");
}

void tokenize(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  json body;
  if (!parse_body(ctx, req, res, body)) return;
  std::vector<uint32_t> ids;
  if (body.contains("messages")) {
    auto request = chat::parse_chat_request(chat::Json::parse(req.body, nullptr, false));
    if (!request.is_ok()) return send_error(res, from_status(request.status()));
    chat::RenderOptions opts;
    auto agp = json_bool(body, "add_generation_prompt", true);
    if (!agp.is_ok()) return send_error(res, bad_request(agp.status().message(), "add_generation_prompt"));
    opts.add_generation_prompt = *agp;
    // Images count as the chat endpoint counts them: each one's expanded placeholder run.
    auto prompt = chat_prompt(ctx, *request, opts);
    if (!prompt.is_ok()) return send_error(res, from_status(prompt.status()));
    ids.assign(prompt->prompt_ids.begin(), prompt->prompt_ids.end());
  } else {
    auto p = body.find("prompt");
    if (p == body.end() || !p->is_string())
      return send_error(res, bad_request("prompt: expected a string (or give messages)", "prompt"));
    auto special = json_bool(body, "add_special_tokens", false);
    if (!special.is_ok()) return send_error(res, bad_request(special.status().message(), "add_special_tokens"));
    ids = ctx.tokenizer->encode(p->get<std::string>(), *special);
  }
  json out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx.max_model_len}};
  res.set_content(out.dump(), "application/json");
}

void detokenize(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  json body;
  if (!parse_body(ctx, req, res, body)) return;
  auto t = body.find("tokens");
  if (t == body.end() || !t->is_array())
    return send_error(res, bad_request("tokens: expected an array of token ids", "tokens"));
  std::vector<uint32_t> ids;
  for (const auto& v : *t) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= ctx.tokenizer->vocab_size())
      return send_error(res, bad_request("tokens: every entry must be a token id in [0, " +
                                             std::to_string(ctx.tokenizer->vocab_size()) + ")",
                                         "tokens"));
    ids.push_back(v.get<uint32_t>());
  }
  res.set_content(json{{"prompt", ctx.tokenizer->decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

// Why a generation cannot start now (503s), or nullopt when it can.
std::optional<ApiError> generation_unready(const ServingContext& ctx, bool draining) {
  if (draining) return shutting_down("The server is shutting down and accepts no new requests.");
  if (!ctx.engine || !ctx.engine->alive()) return ApiError{503, "The engine is not running.", "server_error", "", "engine_dead"};
  return std::nullopt;
}

}  // namespace

void route_request(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res, bool draining) {
  const bool cors = apply_cors(ctx, req, res);
  if (req.method == "OPTIONS") {
    // A CORS preflight carries no credentials by design: answering it needs none.
    if (cors || req.has_header("Origin")) return preflight(ctx, req, res);
    res.status = 204;
    res.set_header("Allow", "GET, POST, OPTIONS");
    return;
  }
  const std::string& path = req.path;
  // The Anthropic routes answer every error in Anthropic's envelope and statuses.
  const bool anthropic = is_anthropic_route(path);
  auto fail = [&](const ApiError& e) { anthropic ? send_anthropic_error(res, e) : send_error(res, e); };
  // The chat page: static bytes, no key (its API calls carry the key the user types).
  if (!ctx.options.disable_web_ui && (req.method == "GET" || req.method == "HEAD") && serve_web_ui(path, res)) return;
  const bool open = (path == "/health" || path == "/metrics") && !ctx.options.protect_metrics;
  if (!open && !authorized(ctx, req)) {
    if (!anthropic) return send_error(res, unauthorized());
    return fail(ApiError{401, "invalid x-api-key", "authentication_error"});  // Anthropic's text
  }

  struct Route {
    const char* path;
    const char* method;
  };
  static const Route routes[] = {{"/health", "GET"},      {"/metrics", "GET"},      {"/v1/models", "GET"},
                                 {"/tokenize", "POST"},   {"/detokenize", "POST"},  {"/v1/chat/completions", "POST"},
                                 {"/v1/completions", "POST"}, {"/v1/responses", "POST"},  {"/v1/messages", "POST"},
                                 {"/v1/messages/count_tokens", "POST"}};
  bool known_path = false;
  for (const Route& r : routes) {
    if (path != r.path) continue;
    known_path = true;
    const bool head = req.method == "HEAD" && std::string(r.method) == "GET";
    if (req.method != r.method && !head) continue;
    if (path == "/health") return health(ctx, res, draining);
    if (path == "/metrics") return metrics(ctx, res);
    if (path == "/v1/models") return models(ctx, res);
    if (path == "/tokenize") return tokenize(ctx, req, res);
    if (path == "/detokenize") return detokenize(ctx, req, res);
    if (path == "/v1/messages/count_tokens") return handle_count_tokens(ctx, req, res);
    if (auto unready = generation_unready(ctx, draining)) return fail(*unready);
    if (path == "/v1/chat/completions") return handle_chat_completions(ctx, req, res);
    if (path == "/v1/responses") return handle_responses(ctx, req, res);
    if (path == "/v1/messages") return handle_messages(ctx, req, res);
    return handle_completions(ctx, req, res);
  }
  if (known_path)
    return fail(ApiError{405, "Method " + req.method + " is not allowed on " + path + ".", "invalid_request_error", "",
                         "method_not_allowed"});
  fail(not_found_error("No route " + req.method + " " + path + ".", "", "not_found"));
}

}  // namespace moonrun::server
