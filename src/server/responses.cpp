// POST /v1/responses: the OpenAI Responses API on the chat pipeline. The request becomes a
// chat body (responses_request.h); the completion's reasoning, content and tool calls
// become output items: a reasoning item (its text as the item's summary: the part the
// Responses clients - the openai SDK's accumulators, the AI SDK, Codex - read and show), a
// message item (output_text), function_call items (with `namespace` for a namespaced tool).
// Streamed, the events are the Responses API's:
//   response.created, response.in_progress,
//   per item: response.output_item.added,
//             [response.reasoning_summary_part.added, response.reasoning_summary_text.delta*,
//              ....done, response.reasoning_summary_part.done
//             | response.content_part.added, response.output_text.delta*, ....done,
//               response.content_part.done
//             | response.function_call_arguments.delta, ....done], response.output_item.done
//   response.completed (status "incomplete" when max_output_tokens cut it)
// each with a sequence_number, framed as `event: TYPE` + `data: JSON`. A response made with
// store (the default) is kept in the ResponseStore for previous_response_id and
// item_reference. Hosted tools the request declared are not shown to the model; the answer
// names them in an `X-Moonrun-Warning` header (and the log).

#include <map>

#include "common/log.h"
#include "server/chat_pipeline.h"
#include "server/handlers.h"
#include "server/responses_request.h"
#include "server/stream_writer.h"

namespace moonrun::server {

using nlohmann::json;

namespace {

json to_plain(const chat::Json& v) { return json::parse(v.dump(-1, ' ', false, chat::Json::error_handler_t::replace)); }

// What the response object echoes of the request, and its usage.
struct ResponseFrame {
  std::string id;
  int64_t created = 0;
  std::string model;
  ResponsesRequest request;
  int max_output_tokens = 0;
  float temperature = 1.0f, top_p = 1.0f;

  json object(const std::string& status, const json& output, const json& usage, bool length_cut) const {
    json r = {{"id", id}, {"object", "response"}, {"created_at", created}, {"status", status},
              {"error", nullptr}, {"model", model}, {"output", output}};
    r["incomplete_details"] = length_cut ? json{{"reason", "max_output_tokens"}} : json(nullptr);
    r["instructions"] = request.instructions.empty() ? json(nullptr) : json(request.instructions);
    r["max_output_tokens"] = max_output_tokens;
    r["metadata"] = json::object();
    r["parallel_tool_calls"] = request.chat_body.value("parallel_tool_calls", true);
    r["temperature"] = temperature;
    r["top_p"] = top_p;
    r["tool_choice"] = request.tool_choice.is_null() ? json("auto") : to_plain(request.tool_choice);
    r["tools"] = request.tools.is_null() ? json::array() : to_plain(request.tools);
    r["text"] = {{"format", request.text_format.is_null() ? json{{"type", "text"}} : to_plain(request.text_format)}};
    r["reasoning"] = {{"effort", request.reasoning_effort.empty() ? json(nullptr) : json(request.reasoning_effort)},
                      {"summary", to_plain(request.reasoning_summary)}};
    r["previous_response_id"] = request.previous_response_id.empty() ? json(nullptr) : json(request.previous_response_id);
    r["store"] = request.store;
    r["truncation"] = "disabled";
    r["usage"] = usage;
    return r;
  }
};

json usage_json(const Usage& u, int reasoning_tokens) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json summary_part(const std::string& text) { return {{"type", "summary_text"}, {"text", text}}; }
// K3's reasoning is written to be read, so it is sent whole as the summary: the field that
// the clients show (Codex and the AI SDK ignore `content`). Sent once, not twice.
json reasoning_item(const std::string& id, const std::string& text, const char* status) {
  return {{"id", id}, {"type", "reasoning"}, {"summary", json::array({summary_part(text)})},
          {"encrypted_content", nullptr}, {"status", status}};
}
json text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}
json message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"status", status},
          {"content", json::array({text_part(text)})}};
}
json call_item(const std::string& id, const ToolCallOut& c, const char* status,
               const std::map<std::string, std::string>& tool_namespace) {
  json item = {{"id", id}, {"type", "function_call"}, {"call_id", c.id}, {"name", c.name},
               {"arguments", c.arguments}, {"status", status}};
  if (auto ns = tool_namespace.find(c.name); ns != tool_namespace.end()) item["namespace"] = ns->second;
  return item;
}

// Keeps a finished response for previous_response_id and item_reference (store: true).
void store_response(const ServingContext& ctx, const ResponseFrame& frame, const json& output) {
  if (!frame.request.store || !ctx.responses) return;
  ctx.responses->put(frame.id, frame.request.input_items, chat::Json::parse(output.dump()));
}

// The streamed events of one response, built from parser deltas.
class EventWriter {
 public:
  explicit EventWriter(std::shared_ptr<const ResponseFrame> frame) : frame_(std::move(frame)) {}

  std::string start() {
    const json snapshot = frame_->object("in_progress", json::array(), nullptr, false);
    std::string out = emit({{"type", "response.created"}, {"response", snapshot}});
    return out + emit({{"type", "response.in_progress"}, {"response", snapshot}});
  }

  std::string delta(const ParsedDelta& d) {
    std::string out;
    if (!d.reasoning.empty()) {
      if (open_ != Open::kReasoning) out += open_reasoning();
      text_ += d.reasoning;
      out += emit({{"type", "response.reasoning_summary_text.delta"}, {"item_id", item_id_},
                   {"output_index", index()}, {"summary_index", 0}, {"delta", d.reasoning}});
    }
    if (!d.content.empty()) {
      if (open_ != Open::kMessage) out += open_message();
      text_ += d.content;
      out += emit({{"type", "response.output_text.delta"}, {"item_id", item_id_}, {"output_index", index()},
                   {"content_index", 0}, {"delta", d.content}, {"logprobs", json::array()}});
    }
    for (const ToolCallOut& c : d.tool_calls) {
      out += close();
      const std::string id = new_response_id("fc");
      json item = call_item(id, c, "in_progress", frame_->request.tool_namespace);
      item["arguments"] = "";
      out += emit({{"type", "response.output_item.added"}, {"output_index", output_.size()}, {"item", item}});
      out += emit({{"type", "response.function_call_arguments.delta"}, {"item_id", id}, {"output_index", output_.size()},
                   {"delta", c.arguments}});
      out += emit({{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", output_.size()},
                   {"arguments", c.arguments}});
      const json done = call_item(id, c, "completed", frame_->request.tool_namespace);
      out += emit({{"type", "response.output_item.done"}, {"output_index", output_.size()}, {"item", done}});
      output_.push_back(done);
      ++calls_;
    }
    return out;
  }

  std::string finish(FinishReason reason, const json& usage) {
    std::string out = close();
    if (!has_message_ && calls_ == 0) {  // a response always says something, if only ""
      out += open_message();
      out += close();
    }
    const bool cut = reason == FinishReason::kLength;
    return out + emit({{"type", cut ? "response.incomplete" : "response.completed"},
                       {"response", frame_->object(cut ? "incomplete" : "completed", output_, usage, cut)}});
  }
  const json& output() const { return output_; }

  std::string error(const Status& st) {
    return emit({{"type", "error"}, {"code", "server_error"}, {"message", st.message()}, {"param", nullptr}});
  }

 private:
  enum class Open { kNone, kReasoning, kMessage };
  size_t index() const { return output_.size(); }
  std::string emit(json e) {
    e["sequence_number"] = seq_++;
    return sse_event(e);
  }
  std::string open_reasoning() {
    std::string out = close();
    open_ = Open::kReasoning;
    item_id_ = new_response_id("rs");
    text_.clear();
    json item = reasoning_item(item_id_, "", "in_progress");
    item["summary"] = json::array();
    out += emit({{"type", "response.output_item.added"}, {"output_index", index()}, {"item", item}});
    out += emit({{"type", "response.reasoning_summary_part.added"}, {"item_id", item_id_}, {"output_index", index()},
                 {"summary_index", 0}, {"part", summary_part("")}});
    return out;
  }
  std::string open_message() {
    std::string out = close();
    open_ = Open::kMessage;
    has_message_ = true;
    item_id_ = new_response_id("msg");
    text_.clear();
    json item = message_item(item_id_, "", "in_progress");
    item["content"] = json::array();
    out += emit({{"type", "response.output_item.added"}, {"output_index", index()}, {"item", item}});
    out += emit({{"type", "response.content_part.added"}, {"item_id", item_id_}, {"output_index", index()},
                 {"content_index", 0}, {"part", text_part("")}});
    return out;
  }
  std::string close() {
    std::string out;
    if (open_ == Open::kReasoning) {
      out += emit({{"type", "response.reasoning_summary_text.done"}, {"item_id", item_id_},
                   {"output_index", index()}, {"summary_index", 0}, {"text", text_}});
      out += emit({{"type", "response.reasoning_summary_part.done"}, {"item_id", item_id_},
                   {"output_index", index()}, {"summary_index", 0}, {"part", summary_part(text_)}});
      const json done = reasoning_item(item_id_, text_, "completed");
      out += emit({{"type", "response.output_item.done"}, {"output_index", index()}, {"item", done}});
      output_.push_back(done);
    } else if (open_ == Open::kMessage) {
      out += emit({{"type", "response.output_text.done"}, {"item_id", item_id_}, {"output_index", index()},
                   {"content_index", 0}, {"text", text_}, {"logprobs", json::array()}});
      out += emit({{"type", "response.content_part.done"}, {"item_id", item_id_}, {"output_index", index()},
                   {"content_index", 0}, {"part", text_part(text_)}});
      const json done = message_item(item_id_, text_, "completed");
      out += emit({{"type", "response.output_item.done"}, {"output_index", index()}, {"item", done}});
      output_.push_back(done);
    }
    open_ = Open::kNone;
    return out;
  }

  std::shared_ptr<const ResponseFrame> frame_;
  int64_t seq_ = 0;
  Open open_ = Open::kNone;
  std::string item_id_, text_;
  json output_ = json::array();
  bool has_message_ = false;
  int calls_ = 0;
};

}  // namespace

void handle_responses(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  json body;
  if (!parse_body(ctx, req, res, body)) return;
  auto converted = responses_to_chat(chat::Json::parse(req.body, nullptr, false), ctx.responses.get());
  if (!converted.is_ok()) return send_error(res, from_status(converted.status()));
  if (!converted->dropped_tools.empty()) {
    std::string list;
    for (const auto& t : converted->dropped_tools) list += (list.empty() ? "" : ", ") + t;
    const std::string warning = "hosted tools are not run by this server and were not shown to the model: " + list;
    MR_LOG(WARNING) << "/v1/responses: " << warning;
    res.set_header("X-Moonrun-Warning", warning);
  }
  auto prepared = prepare_chat(ctx, converted->chat_body);
  if (!prepared.is_ok()) return send_error(res, from_status(prepared.status()));
  for (const auto& w : prepared->request.warnings) MR_LOG(WARNING) << w;
  auto chat = std::make_shared<PreparedChat>(std::move(prepared).value());

  auto frame = std::make_shared<ResponseFrame>();
  frame->id = new_response_id("resp");
  frame->created = unix_time_s();
  frame->model = ctx.served_model_name;
  frame->request = std::move(converted).value();
  frame->max_output_tokens = chat->params.max_tokens;
  frame->temperature = chat->params.temperature;
  frame->top_p = chat->params.top_p;

  auto gen = Generation::start(*ctx.engine, *ctx.metrics, chat->prompt_ids, chat->params, chat->images);
  if (!gen.is_ok()) return send_error(res, from_status(gen.status()));
  const chat::ChatFormat format = ctx.chat_format;

  if (!frame->request.stream) {
    auto samples = (*gen)->collect(client_gone_check(req));
    if (!samples.is_ok()) return send_collect_error(res, samples.status(), (*gen)->client_gone_seen());
    const SampleOutcome& s = (*samples)[0];
    const ChoiceMessage m = parse_sample(*chat, format, s);
    json output = json::array();
    if (!m.reasoning.empty()) output.push_back(reasoning_item(new_response_id("rs"), m.reasoning, "completed"));
    if (!m.content.empty() || m.tool_calls.empty())
      output.push_back(message_item(new_response_id("msg"), m.content, "completed"));
    for (const auto& c : m.tool_calls)
      output.push_back(call_item(new_response_id("fc"), c, "completed", frame->request.tool_namespace));
    store_response(ctx, *frame, output);
    const bool cut = s.finish_reason == FinishReason::kLength;
    const json out = frame->object(cut ? "incomplete" : "completed", output, usage_json((*gen)->usage(), m.reasoning_tokens), cut);
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }

  std::shared_ptr<Generation> g(std::move(gen).value());
  auto writer = std::make_shared<EventWriter>(frame);
  auto parser = std::shared_ptr<ChatOutputParser>(make_chat_output_parser(format, chat->parse_options));
  auto reasoning_tokens = std::make_shared<int>(0);
  StreamHandlers h;
  h.first = writer->start();
  h.done_marker = false;  // the Responses API ends with response.completed, no [DONE]
  h.on_output = [&ctx, frame, writer, parser, reasoning_tokens, g](const RequestOutput& out) {
    if (parser->in_reasoning()) *reasoning_tokens += static_cast<int>(out.new_token_ids.size());
    std::string sse = writer->delta(parser->feed(out.text_delta));
    if (out.finished) {
      sse += writer->delta(parser->finish());
      Usage u = g->usage();
      u.completion_tokens = std::max(u.completion_tokens, out.num_output_tokens);
      sse += writer->finish(out.finish_reason, usage_json(u, *reasoning_tokens));
      store_response(ctx, *frame, writer->output());
    }
    return sse;
  };
  h.on_done = [] { return std::string(); };
  h.on_error = [writer](const Status& st) { return writer->error(st); };
  stream_generation(res, g, std::move(h));
}

}  // namespace moonrun::server
