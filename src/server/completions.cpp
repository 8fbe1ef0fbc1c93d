// POST /v1/completions: a raw prompt (text or token ids), no chat format, no parsers.

#include "common/log.h"
#include "server/generation.h"
#include "server/handlers.h"
#include "server/sampling_request.h"
#include "server/stream_writer.h"

namespace moonrun::server {

using nlohmann::json;

namespace {

json completion_logprobs(const ServingContext& ctx, const std::vector<SampleResult>& lps) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;
  for (const auto& r : lps) {
    std::string t = ctx.tokenizer->decode(std::vector<uint32_t>{static_cast<uint32_t>(r.token)});
    tokens.push_back(t);
    token_lps.push_back(r.logprob);
    json top = json::object();
    for (const auto& c : r.top)
      top[ctx.tokenizer->decode(std::vector<uint32_t>{static_cast<uint32_t>(c.token)})] = c.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += t.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

}  // namespace

void handle_completions(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res) {
  json body;
  if (!parse_body(ctx, req, res, body)) return;

  // prompt: a string, an array of token ids, or a one-element array of either.
  std::vector<int32_t> prompt_ids;
  auto p = body.find("prompt");
  if (p == body.end() || p->is_null()) return send_error(res, bad_request("prompt: required", "prompt"));
  json prompt = *p;
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) prompt = prompt[0];
  if (prompt.is_string()) {
    for (uint32_t id : ctx.tokenizer->encode(prompt.get<std::string>(), /*allow_special=*/false))
      prompt_ids.push_back(static_cast<int32_t>(id));
  } else if (prompt.is_array()) {
    for (const auto& v : prompt) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= ctx.tokenizer->vocab_size())
        return send_error(res, bad_request("prompt: token ids must be integers in [0, " +
                                               std::to_string(ctx.tokenizer->vocab_size()) + ")", "prompt"));
      prompt_ids.push_back(v.get<int32_t>());
    }
  } else {
    return send_error(res, bad_request("prompt: expected a string or an array of token ids "
                                       "(one prompt per request)", "prompt"));
  }
  if (prompt_ids.empty()) return send_error(res, bad_request("prompt: must not be empty", "prompt"));

  auto params = sampling_params_from_json(body, Endpoint::kCompletions);
  if (!params.is_ok()) return send_error(res, from_status(params.status()));
  int max_tokens = params->max_tokens;
  if (max_tokens < 0 && !body.contains("max_tokens")) max_tokens = 16;  // OpenAI's default here
  Status fit = fit_context(ctx, prompt_ids.size(), max_tokens);
  if (!fit.is_ok()) return send_error(res, from_status(fit));
  params->max_tokens = max_tokens;

  auto stream_flag = json_bool(body, "stream", false);
  if (!stream_flag.is_ok()) return send_error(res, bad_request(stream_flag.status().message(), "stream"));
  const bool stream = *stream_flag;
  bool include_usage = false;
  if (auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) return send_error(res, bad_request("stream_options: expected an object", "stream_options"));
    auto u = json_bool(*so, "include_usage", false, "stream_options.");
    if (!u.is_ok()) return send_error(res, bad_request(u.status().message(), "stream_options"));
    include_usage = *u;
  }
  auto echo_flag = json_bool(body, "echo", false);
  if (!echo_flag.is_ok()) return send_error(res, bad_request(echo_flag.status().message(), "echo"));
  const bool echo = *echo_flag;
  // vLLM's return_token_ids: the prompt's ids and each choice's generated ids, so a client
  // (an RL trainer, a test) needs no re-tokenisation.
  auto ids_flag = json_bool(body, "return_token_ids", false);
  if (!ids_flag.is_ok()) return send_error(res, bad_request(ids_flag.status().message(), "return_token_ids"));
  const bool return_ids = *ids_flag;
  const std::vector<int32_t> prompt_ids_copy = return_ids ? prompt_ids : std::vector<int32_t>{};
  const std::string prompt_text = echo ? ctx.tokenizer->decode(std::vector<uint32_t>(prompt_ids.begin(), prompt_ids.end())) : "";

  auto gen = Generation::start(*ctx.engine, *ctx.metrics, std::move(prompt_ids), *params);
  if (!gen.is_ok()) return send_error(res, from_status(gen.status()));
  const std::string id = new_response_id("cmpl");
  const int64_t created = unix_time_s();
  const bool want_logprobs = params->logprobs >= 0;

  if (!stream) {
    auto samples = (*gen)->collect(client_gone_check(req));
    if (!samples.is_ok()) return send_collect_error(res, samples.status(), (*gen)->client_gone_seen());
    json choices = json::array();
    for (size_t i = 0; i < samples->size(); ++i) {
      const auto& s = (*samples)[i];
      json c = {{"index", i}, {"text", prompt_text + s.text},
                {"logprobs", want_logprobs ? completion_logprobs(ctx, s.logprobs) : json(nullptr)},
                {"finish_reason", finish_reason_name(s.finish_reason)}};
      if (!s.stop_reason.empty()) c["stop_reason"] = s.stop_reason;
      if (return_ids) {
        c["prompt_token_ids"] = prompt_ids_copy;
        c["token_ids"] = s.token_ids;
      }
      choices.push_back(c);
    }
    json out = {{"id", id}, {"object", "text_completion"}, {"created", created},
                {"model", ctx.served_model_name}, {"choices", choices}, {"usage", usage_json((*gen)->usage())}};
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }

  std::shared_ptr<Generation> g(std::move(gen).value());
  StreamHandlers h;
  const std::string model = ctx.served_model_name;
  auto chunk = [id, created, model](json choices) {
    return json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                {"choices", std::move(choices)}};
  };
  auto echoed = std::make_shared<std::vector<bool>>(params->n, !echo);
  auto first = std::make_shared<std::vector<bool>>(params->n, true);
  h.on_output = [&ctx, chunk, want_logprobs, echoed, first, prompt_text, return_ids,
                 prompt_ids_copy](const RequestOutput& out) {
    std::string text = out.text_delta;
    const bool in_range = out.index >= 0 && out.index < static_cast<int>(echoed->size());
    if (in_range && !(*echoed)[out.index]) {
      (*echoed)[out.index] = true;
      text = prompt_text + text;
    }
    if (text.empty() && !out.finished && !(return_ids && !out.new_token_ids.empty())) return std::string();
    json c = {{"index", out.index}, {"text", text},
              {"logprobs", want_logprobs ? completion_logprobs(ctx, out.logprobs) : json(nullptr)},
              {"finish_reason", out.finished ? json(finish_reason_name(out.finish_reason)) : json(nullptr)}};
    if (return_ids) {
      if (in_range && (*first)[out.index]) c["prompt_token_ids"] = prompt_ids_copy;
      if (in_range) (*first)[out.index] = false;
      c["token_ids"] = out.new_token_ids;
    }
    return sse_data(chunk(json::array({c})));
  };
  h.on_done = [chunk, g, include_usage]() {
    if (!include_usage) return std::string();
    json c = chunk(json::array());
    c["usage"] = usage_json(g->usage());
    return sse_data(c);
  };
  h.on_error = [](const Status& st) { return sse_data(internal(st.message()).to_json()); };
  stream_generation(res, g, std::move(h));
}

}  // namespace moonrun::server
