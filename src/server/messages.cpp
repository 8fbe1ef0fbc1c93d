// POST /v1/messages: the Anthropic Messages API on the chat pipeline. The request becomes a
// chat body (messages_request.h); the completion becomes content blocks: thinking (the
// reasoning), text (the content), tool_use (each call, its arguments as the input object).
// Streamed, the events are Anthropic's, each framed as `event: TYPE` + `data: JSON`:
//   message_start, per block content_block_start / content_block_delta (thinking_delta,
//   signature_delta, text_delta, input_json_delta) / content_block_stop, message_delta
//   (stop_reason, usage), message_stop. message_start waits for the first engine output, so
//   its usage holds the prefix-cache hit.
// Usage is Anthropic's: input_tokens the uncached part of the prompt, cache_read_input_tokens
// the cached part. Errors are Anthropic's envelope (anthropic_error.h).
// POST /v1/messages/count_tokens renders the same prompt and answers {"input_tokens": N}.

#include "common/log.h"
#include "server/anthropic_error.h"
#include "server/chat_pipeline.h"
#include "server/handlers.h"
#include "server/messages_request.h"
#include "server/stream_writer.h"

namespace moonrun::server {

using nlohmann::json;

namespace {

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

// Anthropic's usage: input_tokens is the part of the prompt that was not read from the
// cache, cache_read_input_tokens the prefix-cache hit; their sum is the whole prompt. The
// prefix cache is filled on every request without being asked, so nothing is counted as
// cache creation.
json usage_json(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens - u.cached_tokens}, {"output_tokens", u.completion_tokens},
          {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", u.cached_tokens}};
}

json thinking_block(const std::string& reasoning, bool omitted) {
  return {{"type", "thinking"}, {"thinking", omitted ? "" : reasoning}, {"signature", thinking_signature(reasoning)}};
}

// Reads the body as handle_messages and handle_count_tokens take it: JSON, a model this
// server serves, then the Messages mapping; errors in Anthropic's envelope.
bool read_request(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res, MessagesRoute route,
                  MessagesRequest& out) {
  json body;
  HttpResponse check;
  if (!parse_body(ctx, req, check, body)) {
    const json e = json::parse(check.body, nullptr, false);
    const std::string message = e.is_object() && e.contains("error") ? e["error"].value("message", "bad request") : "bad request";
    send_anthropic_error(res, ApiError{check.status, message});
    return false;
  }
  auto converted = messages_to_chat(chat::Json::parse(req.body, nullptr, false), route);
  if (!converted.is_ok()) {
    send_anthropic_error(res, from_status(converted.status()));
    return false;
  }
  out = std::move(converted).value();
  return true;
}

// The streamed events of one message, built from parser deltas.
class EventWriter {
 public:
  EventWriter(std::string id, std::string model, const MessagesRequest& request)
      : id_(std::move(id)), model_(std::move(model)), thinking_omitted_(request.thinking_omitted),
        context_management_(request.context_management) {}

  // message_start goes out with the first engine output, when the prefix cache has been
  // consulted, so its usage holds the real cached count (as Anthropic's does).
  std::string start(const Usage& usage) {
    if (started_) return "";
    started_ = true;
    json u = usage_json(usage);
    u["output_tokens"] = 0;
    json message = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"content", json::array()},
                    {"model", model_}, {"stop_reason", nullptr}, {"stop_sequence", nullptr}, {"usage", u}};
    return sse_event({{"type", "message_start"}, {"message", message}}) + sse_event({{"type", "ping"}});
  }

  std::string delta(const ParsedDelta& d) {
    std::string out;
    if (!d.reasoning.empty()) {
      if (open_ != Open::kThinking) out += open({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, Open::kThinking);
      reasoning_ += d.reasoning;
      if (!thinking_omitted_)
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
    json delta = {{"type", "message_delta"},
                  {"delta", {{"stop_reason", stop_reason(reason, calls_ > 0, stop_sequence)},
                             {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)}}},
                  {"usage", usage_json(usage)}};
    if (context_management_) delta["context_management"] = {{"applied_edits", json::array()}};
    out += sse_event(delta);
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
    if (open_ == Open::kThinking) {  // the signature carries the reasoning back (thinking_signature)
      out += sse_event({{"type", "content_block_delta"}, {"index", index_},
                        {"delta", {{"type", "signature_delta"}, {"signature", thinking_signature(reasoning_)}}}});
      reasoning_.clear();
    }
    out += sse_event({{"type", "content_block_stop"}, {"index", index_}});
    open_ = Open::kNone;
    return out;
  }

  std::string id_, model_;
  bool thinking_omitted_, context_management_;
  bool started_ = false;
  std::string reasoning_;  // of the open thinking block
  int index_ = -1;
  Open open_ = Open::kNone;
  bool has_text_ = false;
  int calls_ = 0;
};

}  // namespace

void handle_messages(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  MessagesRequest request;
  if (!read_request(ctx, req, res, MessagesRoute::kCreate, request)) return;
  auto prepared = prepare_chat(ctx, request.chat_body, anthropic_fit_context);
  if (!prepared.is_ok()) return send_anthropic_error(res, from_status(prepared.status()));
  for (const auto& w : prepared->request.warnings) MR_LOG(WARNING) << w;
  auto chat = std::make_shared<PreparedChat>(std::move(prepared).value());

  auto gen = Generation::start(*ctx.engine, *ctx.metrics, chat->prompt_ids, chat->params, chat->images);
  if (!gen.is_ok()) return send_anthropic_error(res, from_status(gen.status()));
  const std::string id = new_response_id("msg");
  const chat::ChatFormat format = ctx.chat_format;

  if (!request.stream) {
    auto samples = (*gen)->collect(client_gone_check(req));
    if (!samples.is_ok()) {
      if ((*gen)->client_gone_seen()) return send_collect_error(res, samples.status(), true);
      const ApiError e = samples.status().code() == StatusCode::kUnavailable ? shutting_down(samples.status().message())
                                                                             : internal(samples.status().message());
      return send_anthropic_error(res, e);
    }
    const SampleOutcome& s = (*samples)[0];
    const ChoiceMessage m = parse_sample(*chat, format, s);
    json content = json::array();
    if (!m.reasoning.empty()) content.push_back(thinking_block(m.reasoning, request.thinking_omitted));
    if (!m.content.empty() || m.tool_calls.empty()) content.push_back({{"type", "text"}, {"text", m.content}});
    for (const auto& c : m.tool_calls)
      content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", tool_input(c.arguments)}});
    json out = {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", ctx.served_model_name},
                {"content", content},
                {"stop_reason", stop_reason(s.finish_reason, !m.tool_calls.empty(), s.stop_reason)},
                {"stop_sequence", s.stop_reason.empty() ? json(nullptr) : json(s.stop_reason)},
                {"usage", usage_json((*gen)->usage())}};
    if (request.context_management) out["context_management"] = {{"applied_edits", json::array()}};
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }

  std::shared_ptr<Generation> g(std::move(gen).value());
  auto writer = std::make_shared<EventWriter>(id, ctx.served_model_name, request);
  auto parser = std::shared_ptr<ChatOutputParser>(make_chat_output_parser(format, chat->parse_options));
  StreamHandlers h;
  h.done_marker = false;  // Anthropic streams end with message_stop
  h.on_output = [writer, parser, g](const RequestOutput& out) {
    std::string sse = writer->start(g->usage());
    sse += writer->delta(parser->feed(out.text_delta));
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

void handle_count_tokens(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  MessagesRequest request;
  if (!read_request(ctx, req, res, MessagesRoute::kCountTokens, request)) return;
  auto parsed = chat::parse_chat_request(request.chat_body);
  if (!parsed.is_ok()) return send_anthropic_error(res, from_status(parsed.status()));
  // The prompt exactly as /v1/messages would render it (images expanded to their rows).
  auto prompt = chat_prompt(ctx, *parsed);
  if (!prompt.is_ok()) return send_anthropic_error(res, from_status(prompt.status()));
  res.set_content(json{{"input_tokens", prompt->prompt_ids.size()}}.dump(), "application/json");
}

}  // namespace moonrun::server
