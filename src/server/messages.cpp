// POST /v1/messages: the Anthropic Messages API on the chat pipeline. The request becomes a
// chat body (messages_request.h); the completion becomes content blocks: thinking (the
// reasoning), text (the content), tool_use (each call, its arguments as the input object).
// Streamed, the events are Anthropic's, each framed as `event: TYPE` + `data: JSON`:
//   message_start, per block content_block_start / content_block_delta (thinking_delta,
//   signature_delta, text_delta, input_json_delta) / content_block_stop, message_delta
//   (stop_reason, usage), message_stop.
// Errors are Anthropic's envelope: {"type": "error", "error": {"type", "message"}}.

#include "common/log.h"
#include "server/chat_pipeline.h"
#include "server/handlers.h"
#include "server/messages_request.h"
#include "server/stream_writer.h"

namespace moonrun::server {

using nlohmann::json;

namespace {

const char* anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
  }
}

void send_anthropic_error(HttpResponse& res, const ApiError& e) {
  res.status = e.http_status;
  const json body = {{"type", "error"}, {"error", {{"type", anthropic_error_type(e.http_status)}, {"message", e.message}}}};
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// The tool input object of a call: its arguments parsed; arguments that are not a JSON
// object (a K2 model's broken JSON) become {} rather than a block the client cannot read.
json tool_input(const std::string& arguments) {
  json v = json::parse(arguments, nullptr, false);
  return v.is_object() ? v : json::object();
}

const char* stop_reason(FinishReason reason, bool tool_calls, const std::string& stop_sequence) {
  if (reason == FinishReason::kLength) return "max_tokens";
  if (tool_calls) return "tool_use";
  if (!stop_sequence.empty()) return "stop_sequence";
  return "end_turn";
}

json usage_json(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens}, {"output_tokens", u.completion_tokens},
          {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", u.cached_tokens}};
}

// The streamed events of one message, built from parser deltas.
class EventWriter {
 public:
  EventWriter(std::string id, std::string model) : id_(std::move(id)), model_(std::move(model)) {}

  std::string start(int input_tokens) {
    json message = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"content", json::array()},
                    {"model", model_}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                    {"usage", {{"input_tokens", input_tokens}, {"output_tokens", 0},
                               {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", 0}}}};
    return sse_event({{"type", "message_start"}, {"message", message}}) + sse_event({{"type", "ping"}});
  }

  std::string delta(const ParsedDelta& d) {
    std::string out;
    if (!d.reasoning.empty()) {
      if (open_ != Open::kThinking) out += open({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, Open::kThinking);
      out += sse_event({{"type", "content_block_delta"}, {"index", index_},
                    {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
    }
    if (!d.content.empty()) {
      if (open_ != Open::kText) out += open({{"type", "text"}, {"text", ""}}, Open::kText);
      out += sse_event({{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
      has_text_ = true;
    }
    for (const ToolCallOut& c : d.tool_calls) {
      out += open({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::object()}}, Open::kTool);
      out += sse_event({{"type", "content_block_delta"}, {"index", index_},
                    {"delta", {{"type", "input_json_delta"}, {"partial_json", tool_input(c.arguments).dump()}}}});
      out += close();
      ++calls_;
    }
    return out;
  }

  std::string finish(FinishReason reason, const std::string& stop_sequence, const Usage& usage) {
    std::string out = close();
    if (!has_text_ && calls_ == 0) {
      out += open({{"type", "text"}, {"text", ""}}, Open::kText);
      out += close();
    }
    out += sse_event({{"type", "message_delta"},
                  {"delta", {{"stop_reason", stop_reason(reason, calls_ > 0, stop_sequence)},
                             {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)}}},
                  {"usage", usage_json(usage)}});
    return out + sse_event({{"type", "message_stop"}});
  }

 private:
  enum class Open { kNone, kThinking, kText, kTool };
  std::string open(const json& block, Open kind) {
    std::string out = close();
    ++index_;
    open_ = kind;
    return out + sse_event({{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
  }
  std::string close() {
    if (open_ == Open::kNone) return "";
    std::string out;
    if (open_ == Open::kThinking)  // no signature: nothing to verify, the client echoes ""
      out += sse_event({{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
    out += sse_event({{"type", "content_block_stop"}, {"index", index_}});
    open_ = Open::kNone;
    return out;
  }

  std::string id_, model_;
  int index_ = -1;
  Open open_ = Open::kNone;
  bool has_text_ = false;
  int calls_ = 0;
};

}  // namespace

void handle_messages(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  json body;
  {
    HttpResponse check;
    if (!parse_body(ctx, req, check, body)) {
      const json e = json::parse(check.body, nullptr, false);
      const std::string message = e.is_object() && e.contains("error") ? e["error"].value("message", "bad request") : "bad request";
      return send_anthropic_error(res, ApiError{check.status, message});
    }
  }
  auto converted = messages_to_chat(chat::Json::parse(req.body, nullptr, false));
  if (!converted.is_ok()) return send_anthropic_error(res, from_status(converted.status()));
  auto prepared = prepare_chat(ctx, converted->chat_body);
  if (!prepared.is_ok()) return send_anthropic_error(res, from_status(prepared.status()));
  for (const auto& w : prepared->request.warnings) MR_LOG(WARNING) << w;
  auto chat = std::make_shared<PreparedChat>(std::move(prepared).value());

  auto gen = Generation::start(*ctx.engine, *ctx.metrics, chat->prompt_ids, chat->params, chat->images);
  if (!gen.is_ok()) return send_anthropic_error(res, from_status(gen.status()));
  const std::string id = new_response_id("msg");
  const chat::ChatFormat format = ctx.chat_format;

  if (!converted->stream) {
    auto samples = (*gen)->collect(client_gone_check(req));
    if (!samples.is_ok()) {
      if ((*gen)->client_gone_seen()) return send_collect_error(res, samples.status(), true);
      return send_anthropic_error(res, internal(samples.status().message()));
    }
    const SampleOutcome& s = (*samples)[0];
    const ChoiceMessage m = parse_sample(*chat, format, s);
    json content = json::array();
    if (!m.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", m.reasoning}, {"signature", ""}});
    if (!m.content.empty() || m.tool_calls.empty()) content.push_back({{"type", "text"}, {"text", m.content}});
    for (const auto& c : m.tool_calls)
      content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", tool_input(c.arguments)}});
    const json out = {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", ctx.served_model_name},
                      {"content", content},
                      {"stop_reason", stop_reason(s.finish_reason, !m.tool_calls.empty(), s.stop_reason)},
                      {"stop_sequence", s.stop_reason.empty() ? json(nullptr) : json(s.stop_reason)},
                      {"usage", usage_json((*gen)->usage())}};
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }

  std::shared_ptr<Generation> g(std::move(gen).value());
  auto writer = std::make_shared<EventWriter>(id, ctx.served_model_name);
  auto parser = std::shared_ptr<ChatOutputParser>(make_chat_output_parser(format, chat->parse_options));
  StreamHandlers h;
  h.first = writer->start(static_cast<int>(chat->prompt_ids.size()));
  h.done_marker = false;  // Anthropic streams end with message_stop
  h.on_output = [writer, parser, g](const RequestOutput& out) {
    std::string sse = writer->delta(parser->feed(out.text_delta));
    if (out.finished) {
      sse += writer->delta(parser->finish());
      sse += writer->finish(out.finish_reason, out.stop_reason, g->usage());
    }
    return sse;
  };
  h.on_done = [] { return std::string(); };
  h.on_error = [](const Status& st) {
    return sse_event({{"type", "error"}, {"error", {{"type", "api_error"}, {"message", st.message()}}}});
  };
  stream_generation(res, g, std::move(h));
}

}  // namespace moonrun::server
