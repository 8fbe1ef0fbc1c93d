// POST /v1/chat/completions: render the conversation in the checkpoint's chat format, run
// it (constrained when the request asks for structured output or a tool call), and parse
// the completion back into reasoning_content, content and tool_calls.

#include "common/log.h"
#include "server/chat_pipeline.h"
#include "server/handlers.h"
#include "server/stream_writer.h"

namespace moonrun::server {

using nlohmann::json;

namespace {

json tool_calls_json(const std::vector<ToolCallOut>& calls, int first_index, bool with_index) {
  json arr = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id}, {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = first_index + static_cast<int>(i);
    arr.push_back(c);
  }
  return arr;
}

json usage_json(const Usage& u, int reasoning_tokens) {
  json usage = {{"prompt_tokens", u.prompt_tokens},
                {"completion_tokens", u.completion_tokens},
                {"total_tokens", u.prompt_tokens + u.completion_tokens},
                {"reasoning_tokens", reasoning_tokens},
                {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  // The seed's shape for an image prompt: prompt_tokens_details.image_tokens (and the same
  // count at the top level, beside reasoning_tokens). Text-only answers keep vLLM's shape.
  if (u.image_tokens > 0) {
    usage["prompt_tokens_details"]["image_tokens"] = u.image_tokens;
    usage["image_tokens"] = u.image_tokens;
  }
  return usage;
}

json chat_logprobs(const ServingContext& ctx, const std::vector<SampleResult>& lps) {
  auto entry = [&ctx](int32_t token, float lp) {
    std::string t = ctx.tokenizer->decode(std::vector<uint32_t>{static_cast<uint32_t>(token)});
    json bytes = json::array();
    for (unsigned char c : t) bytes.push_back(c);
    return json{{"token", t}, {"logprob", lp}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const auto& r : lps) {
    json e = entry(r.token, r.logprob);
    json top = json::array();
    for (const auto& c : r.top) top.push_back(entry(c.token, c.logprob));
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return {{"content", content}};
}

}  // namespace

void handle_chat_completions(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  json body;
  if (!parse_body(ctx, req, res, body)) return;
  // The chat layer keeps the client's key order (it is rendered back byte for byte).
  auto prepared = prepare_chat(ctx, chat::Json::parse(req.body, nullptr, false));
  if (!prepared.is_ok()) return send_error(res, from_status(prepared.status()));
  for (const auto& w : prepared->request.warnings) MR_LOG(WARNING) << w;
  auto chat = std::make_shared<PreparedChat>(std::move(prepared).value());

  // vLLM's return_token_ids (non-streaming): the rendered prompt's ids and each choice's
  // generated ids.
  auto ids_flag = json_bool(body, "return_token_ids", false);
  if (!ids_flag.is_ok()) return send_error(res, bad_request(ids_flag.status().message(), "return_token_ids"));

  const chat::ChatFormat format = ctx.chat_format;
  auto gen = Generation::start(*ctx.engine, *ctx.metrics, chat->prompt_ids, chat->params, chat->images);
  if (!gen.is_ok()) return send_error(res, from_status(gen.status()));
  const std::string id = new_response_id("chatcmpl");
  const int64_t created = unix_time_s();
  const std::string model = ctx.served_model_name;
  const bool want_logprobs = chat->params.logprobs >= 0;
  const int n = chat->params.n;

  if (!chat->request.stream) {
    auto samples = (*gen)->collect(client_gone_check(req));
    if (!samples.is_ok()) return send_collect_error(res, samples.status(), (*gen)->client_gone_seen());
    json choices = json::array();
    int reasoning_tokens = 0;
    for (int i = 0; i < n; ++i) {
      const SampleOutcome& s = (*samples)[i];
      const ChoiceMessage m = parse_sample(*chat, format, s);
      reasoning_tokens += m.reasoning_tokens;
      json message = {{"role", "assistant"}};
      message["content"] = m.content.empty() && !m.tool_calls.empty() ? json(nullptr) : json(m.content);
      message["reasoning_content"] = m.reasoning.empty() ? json(nullptr) : json(m.reasoning);
      message["reasoning"] = message["reasoning_content"];
      if (!m.tool_calls.empty()) message["tool_calls"] = tool_calls_json(m.tool_calls, 0, false);
      json choice = {{"index", i}, {"message", message},
                     {"logprobs", want_logprobs ? chat_logprobs(ctx, s.logprobs) : json(nullptr)},
                     {"finish_reason", chat_finish_reason(s.finish_reason, !m.tool_calls.empty())}};
      if (!s.stop_reason.empty()) choice["stop_reason"] = s.stop_reason;
      if (*ids_flag) choice["token_ids"] = s.token_ids;
      choices.push_back(choice);
    }
    json out = {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
                {"choices", choices}, {"usage", usage_json((*gen)->usage(), reasoning_tokens)}};
    if (*ids_flag) out["prompt_token_ids"] = chat->prompt_ids;
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }

  // Streaming: one parser per choice; deltas as they come; each tool call when it closes.
  struct ChoiceState {
    std::unique_ptr<ChatOutputParser> parser;
    int tool_calls = 0;
  };
  auto choices = std::make_shared<std::vector<ChoiceState>>(n);
  for (auto& c : *choices) c.parser = make_chat_output_parser(format, chat->parse_options);
  auto reasoning_tokens = std::make_shared<int>(0);
  std::shared_ptr<Generation> g(std::move(gen).value());
  auto chunk = [id, created, model](json choice_list) {
    return json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                {"choices", std::move(choice_list)}};
  };
  StreamHandlers h;
  {
    json first = json::array();
    for (int i = 0; i < n; ++i)
      first.push_back({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                       {"logprobs", nullptr}, {"finish_reason", nullptr}});
    h.first = sse_data(chunk(first));
  }
  h.on_output = [&ctx, chunk, choices, reasoning_tokens, want_logprobs](const RequestOutput& out) {
    if (out.index < 0 || out.index >= static_cast<int>(choices->size())) return std::string();
    ChoiceState& c = (*choices)[out.index];
    if (c.parser->in_reasoning()) *reasoning_tokens += static_cast<int>(out.new_token_ids.size());
    ParsedDelta d = c.parser->feed(out.text_delta);
    if (out.finished) {
      ParsedDelta tail = c.parser->finish();
      d.reasoning += tail.reasoning;
      d.content += tail.content;
      d.tool_calls.insert(d.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
    }
    std::string sse;
    if (!d.empty() || (want_logprobs && !out.logprobs.empty())) {
      json delta = json::object();
      if (!d.reasoning.empty()) {
        delta["reasoning_content"] = d.reasoning;
        delta["reasoning"] = d.reasoning;
      }
      if (!d.content.empty()) delta["content"] = d.content;
      if (!d.tool_calls.empty()) {
        delta["tool_calls"] = tool_calls_json(d.tool_calls, c.tool_calls, true);
        c.tool_calls += static_cast<int>(d.tool_calls.size());
      }
      sse += sse_data(chunk(json::array({{{"index", out.index}, {"delta", delta},
                                          {"logprobs", want_logprobs ? chat_logprobs(ctx, out.logprobs) : json(nullptr)},
                                          {"finish_reason", nullptr}}})));
    }
    if (out.finished) {
      json fin = {{"index", out.index}, {"delta", json::object()}, {"logprobs", nullptr},
                  {"finish_reason", chat_finish_reason(out.finish_reason, c.tool_calls > 0)}};
      if (!out.stop_reason.empty()) fin["stop_reason"] = out.stop_reason;
      sse += sse_data(chunk(json::array({fin})));
    }
    return sse;
  };
  const bool include_usage = chat->request.include_usage;
  h.on_done = [chunk, g, include_usage, reasoning_tokens]() {
    if (!include_usage) return std::string();
    json c = chunk(json::array());
    c["usage"] = usage_json(g->usage(), *reasoning_tokens);
    return sse_data(c);
  };
  h.on_error = [](const Status& st) { return sse_data(internal(st.message()).to_json()); };
  stream_generation(res, g, std::move(h));
}

}  // namespace moonrun::server
