#include "server/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>

#include "common/log.h"
#include "server/client_connection.h"
#include "server/handlers.h"

namespace moonrun::server {

using nlohmann::json;

void send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  res.set_content(error.to_json().dump(), "application/json");
}

std::function<bool()> client_gone_check(const httplib::Request& req) {
  const ClientConnection conn = ClientConnection::of(req);
  if (!conn.found()) {
    MR_LOG(WARNING) << "cannot find the socket of " << req.remote_addr << ":" << req.remote_port
                    << "; a disconnect of this client is noticed only when its answer is written";
    return nullptr;
  }
  return [conn] { return conn.gone(); };
}

void send_collect_error(httplib::Response& res, const Status& status, bool client_gone) {
  if (client_gone)
    return send_error(res, ApiError{499, "The client closed the connection before the response was "
                                         "ready; the request was aborted.",
                                    "invalid_request_error", "", "client_closed_request"});
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
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string sse_data(const json& chunk) {
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
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
                        " tokens. However, you requested " +
                        std::to_string(prompt_tokens + max_tokens) + " tokens (" +
                        std::to_string(prompt_tokens) + " in the messages, " +
                        std::to_string(max_tokens) +
                        " in the completion). Please reduce the length of the messages or completion.");
  }
  return Status::ok();
}

bool parse_body(const ServingContext& ctx, const httplib::Request& req, httplib::Response& res,
                json& body) {
  body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    send_error(res, bad_request("Request body is not valid JSON.", "", "invalid_json"));
    return false;
  }
  if (!body.is_object()) {
    send_error(res, bad_request("Request body must be a JSON object."));
    return false;
  }
  auto it = body.find("model");
  if (it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      send_error(res, bad_request("model: expected a string", "model"));
      return false;
    }
    const std::string name = it->get<std::string>();
    // Empty or the served name; vLLM also accepts the model path.
    if (!name.empty() && name != ctx.served_model_name && name != ctx.options.model_path) {
      send_error(res, not_found_error("The model '" + name + "' does not exist. This server serves '" +
                                          ctx.served_model_name + "'.",
                                      "model", "model_not_found"));
      return false;
    }
  }
  return true;
}

HttpServer::HttpServer(const ServingContext& ctx) : ctx_(ctx), http_(new httplib::Server()) {
  const int threads = std::max(8, ctx.options.http_threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(ctx.options.max_request_bytes);
  http_->set_keep_alive_max_count(1000);
  http_->set_read_timeout(60, 0);
  http_->set_write_timeout(60, 0);
  install_routes();
}

HttpServer::~HttpServer() = default;

Status HttpServer::bind() {
  if (ctx_.options.port == 0) {  // any free port (tests): the log line says which
    port_ = http_->bind_to_any_port(ctx_.options.host);
    if (port_ <= 0) return unavailable("cannot listen on " + ctx_.options.host + " (no free port)");
    return Status::ok();
  }
  if (!http_->bind_to_port(ctx_.options.host, ctx_.options.port))
    return unavailable("cannot listen on " + ctx_.options.host + ":" +
                       std::to_string(ctx_.options.port) + " (address in use or not available)");
  port_ = ctx_.options.port;
  return Status::ok();
}

void HttpServer::serve() { http_->listen_after_bind(); }
void HttpServer::stop() { http_->stop(); }

void HttpServer::install_routes() {
  const ServingContext& ctx = ctx_;
  auto& http = *http_;

  // Bearer auth on every route but /health; unknown routes get a 404 envelope (below).
  http.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (ctx.options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string expected = "Bearer " + ctx.options.api_key;
    if (auth != expected && req.get_header_value("x-api-key") != ctx.options.api_key) {
      if (ctx.metrics) ctx.metrics->request_rejected(401);
      send_error(res, unauthorized());
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  http.set_error_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (ctx.metrics && res.status != 404) ctx.metrics->request_rejected(res.status);
    if (res.status == 404) {
      send_error(res, not_found_error("No route " + req.method + " " + req.path + ".", "", "not_found"));
    } else if (res.status == 413) {
      send_error(res, payload_too_large(ctx.options.max_request_bytes));
    } else if (res.status == 405) {
      send_error(res, ApiError{405, "Method " + req.method + " is not allowed on " + req.path + ".",
                               "invalid_request_error", "", "method_not_allowed"});
    } else {
      send_error(res, ApiError{res.status, "HTTP error " + std::to_string(res.status) + ".",
                               "invalid_request_error", "", ""});
    }
  });

  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    MR_LOG(ERROR) << "request handler failed: " << what;
    send_error(res, internal("Internal server error: " + what));
  });

  http.Get("/health", [&ctx](const httplib::Request&, httplib::Response& res) {
    const bool ok = ctx.engine && ctx.engine->alive();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "" : "engine is not running", "text/plain");
  });

  http.Get("/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", ctx.served_model_name}, {"object", "model"}, {"created", ctx.created_unix_s},
                  {"owned_by", "moonrun"}, {"root", ctx.options.model_path.empty() ? ctx.served_model_name : ctx.options.model_path},
                  {"parent", nullptr}, {"max_model_len", ctx.max_model_len}};
    res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(), "application/json");
  });

  http.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
    if (ctx.engine && ctx.metrics) {
      EngineStats s = ctx.engine->stats();
      ctx.metrics->set_running(s.num_running);
      ctx.metrics->set_waiting(s.num_waiting);
      ctx.metrics->set_kv_cache_usage(s.cache.usage());
      ctx.metrics->set_kda_slots_used(s.cache.total_slots - s.cache.free_slots);
      ctx.metrics->set_prompt_tokens_total(static_cast<uint64_t>(s.prompt_tokens_total));
      ctx.metrics->set_generation_tokens_total(static_cast<uint64_t>(s.generation_tokens_total));
    }
    res.set_content(ctx.metrics ? ctx.metrics->render() : "", "text/plain; version=0.0.4");
  });

  http.Post("/tokenize", [&ctx](const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!parse_body(ctx, req, res, body)) return;
    std::vector<uint32_t> ids;
    if (body.contains("messages")) {
      auto request = chat::parse_chat_request(chat::Json::parse(req.body, nullptr, false));
      if (!request.is_ok()) return send_error(res, from_status(request.status()));
      chat::RenderOptions opts;
      opts.add_generation_prompt = body.value("add_generation_prompt", true);
      auto segments = chat::render_chat(ctx.chat_format, *request, opts);
      if (!segments.is_ok()) return send_error(res, from_status(segments.status()));
      for (const auto& s : *segments) ctx.tokenizer->encode_append(s.text, s.allow_special, ids);
    } else {
      auto p = body.find("prompt");
      if (p == body.end() || !p->is_string())
        return send_error(res, bad_request("prompt: expected a string (or give messages)", "prompt"));
      bool special = body.value("add_special_tokens", false);
      ids = ctx.tokenizer->encode(p->get<std::string>(), special);
    }
    json out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx.max_model_len}};
    res.set_content(out.dump(), "application/json");
  });

  http.Post("/detokenize", [&ctx](const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!parse_body(ctx, req, res, body)) return;
    auto t = body.find("tokens");
    if (t == body.end() || !t->is_array()) return send_error(res, bad_request("tokens: expected an array of token ids", "tokens"));
    std::vector<uint32_t> ids;
    for (const auto& v : *t) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= ctx.tokenizer->vocab_size())
        return send_error(res, bad_request("tokens: every entry must be a token id in [0, " +
                                               std::to_string(ctx.tokenizer->vocab_size()) + ")", "tokens"));
      ids.push_back(v.get<uint32_t>());
    }
    res.set_content(json{{"prompt", ctx.tokenizer->decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
  });

  auto generation_guard = [this, &ctx](httplib::Response& res) {
    if (draining_) {
      send_error(res, overloaded("The server is shutting down and accepts no new requests."));
      return false;
    }
    if (!ctx.engine || !ctx.engine->alive()) {
      send_error(res, ApiError{503, "The engine is not running.", "server_error", "", "engine_dead"});
      return false;
    }
    return true;
  };
  http.Post("/v1/chat/completions", [&ctx, generation_guard](const httplib::Request& req, httplib::Response& res) {
    if (generation_guard(res)) handle_chat_completions(ctx, req, res);
  });
  http.Post("/v1/completions", [&ctx, generation_guard](const httplib::Request& req, httplib::Response& res) {
    if (generation_guard(res)) handle_completions(ctx, req, res);
  });
  http.Post("/v1/responses", [&ctx, generation_guard](const httplib::Request& req, httplib::Response& res) {
    if (generation_guard(res)) handle_responses(ctx, req, res);
  });
  http.Post("/v1/messages", [&ctx, generation_guard](const httplib::Request& req, httplib::Response& res) {
    if (generation_guard(res)) handle_messages(ctx, req, res);
  });
}

}  // namespace moonrun::server
