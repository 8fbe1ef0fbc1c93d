// Streaming OpenAI client for `moonrun bench` (see bench_client.h).
#include "tools/bench_client.h"

#include <httplib.h>

namespace moonrun::tools {

using nlohmann::json;

namespace {

double seconds_since(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}

// The text a streamed chunk carries: content, or reasoning (K3 always thinks, and its
// reasoning tokens are generated tokens too), or a completion's text.
bool chunk_has_text(const json& chunk) {
  auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array()) return false;
  for (const auto& c : *choices) {
    if (auto t = c.find("text"); t != c.end() && t->is_string() && !t->get_ref<const std::string&>().empty())
      return true;
    auto d = c.find("delta");
    if (d == c.end() || !d->is_object()) continue;
    for (const char* key : {"content", "reasoning_content", "reasoning"})
      if (auto t = d->find(key); t != d->end() && t->is_string() && !t->get_ref<const std::string&>().empty())
        return true;
    if (auto t = d->find("tool_calls"); t != d->end() && t->is_array() && !t->empty()) return true;
  }
  return false;
}

std::string clip(std::string s, size_t n = 160) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  if (s.size() > n) s = s.substr(0, n) + "...";
  return s;
}

// The message of an OpenAI error envelope, or the raw body.
std::string error_message(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    if (auto e = j.find("error"); e != j.end()) {
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
        return clip((*e)["message"].get<std::string>());
      if (e->is_string()) return clip(e->get<std::string>());
    }
    if (auto m = j.find("message"); m != j.end() && m->is_string()) return clip(m->get<std::string>());
  }
  return clip(body);
}

}  // namespace

std::string parse_base_url(const std::string& url, BenchTarget* t) {
  std::string u = url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  if (u.rfind("https://", 0) == 0)
    return "--base-url " + url + ": https is not supported (cpp-httplib built without OpenSSL); use http://";
  if (u.rfind("http://", 0) != 0) return "--base-url " + url + ": must start with http://";
  size_t path = u.find('/', 7);
  t->scheme_host_port = u.substr(0, path);
  std::string prefix = path == std::string::npos ? "" : u.substr(path);
  if (prefix.size() < 3 || prefix.compare(prefix.size() - 3, 3, "/v1") != 0) prefix += "/v1";
  t->api_prefix = prefix;
  if (t->scheme_host_port.size() <= 7) return "--base-url " + url + ": no host";
  return "";
}

json bench_request_body(const BenchTarget& target, const std::string& model, const BenchPrompt& p,
                        bool ignore_eos) {
  json body = {{"model", model},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"max_tokens", p.max_tokens},
               {"temperature", 0.0}};
  if (target.endpoint == BenchEndpoint::kChat)
    body["messages"] = p.messages.is_array() ? p.messages : json::array({{{"role", "user"}, {"content", p.text}}});
  else
    body["prompt"] = p.text;
  // vLLM and SGLang extension: generate exactly max_tokens, so runs are comparable.
  if (ignore_eos) body["ignore_eos"] = true;
  return body;
}

BenchClient::BenchClient(const BenchTarget& target) : target_(target) { reset(); }
BenchClient::~BenchClient() = default;

void BenchClient::reset() {
  http_ = std::make_unique<httplib::Client>(target_.scheme_host_port);
  http_->set_keep_alive(true);
  http_->set_tcp_nodelay(true);
  http_->set_connection_timeout(10, 0);
  const time_t secs = time_t(target_.timeout_s);
  http_->set_read_timeout(secs, 0);
  http_->set_write_timeout(secs, 0);
}

RequestResult BenchClient::run(int64_t index, const json& body, BenchClock::time_point t0) {
  RequestResult r;
  r.index = index;
  httplib::Request req;
  req.method = "POST";
  req.path = target_.api_prefix + (target_.endpoint == BenchEndpoint::kChat ? "/chat/completions" : "/completions");
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  if (!target_.api_key.empty()) req.set_header("Authorization", "Bearer " + target_.api_key);

  int status = 0;
  std::string error_body;  // the body of a non-200 reply
  bool done = false;       // saw data: [DONE]
  std::string stream_error;
  SseParser sse;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, n);
      return true;
    }
    const double now = seconds_since(t0);
    sse.feed(data, n, [&](const std::string& payload) {
      if (payload == "[DONE]") {
        done = true;
        return;
      }
      json chunk = json::parse(payload, nullptr, false);
      if (chunk.is_discarded()) {
        if (stream_error.empty()) stream_error = "unparseable SSE event: " + clip(payload, 80);
        return;
      }
      if (chunk.contains("error")) {
        if (stream_error.empty()) stream_error = "error event: " + error_message(payload);
        return;
      }
      if (chunk_has_text(chunk)) {
        if (r.first_token_s < 0) r.first_token_s = now;
        r.chunk_times_s.push_back(now);
      }
      if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) {
        if (u->contains("completion_tokens") && (*u)["completion_tokens"].is_number_integer()) {
          r.completion_tokens = (*u)["completion_tokens"].get<int64_t>();
          r.usage_reported = true;
        }
        if (u->contains("prompt_tokens") && (*u)["prompt_tokens"].is_number_integer())
          r.prompt_tokens = (*u)["prompt_tokens"].get<int64_t>();
      }
    });
    return true;
  };

  r.start_s = seconds_since(t0);
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  bool sent = http_->send(req, res, err);
  r.end_s = seconds_since(t0);
  if (!r.usage_reported) r.completion_tokens = r.n_chunks();

  if (!sent || err != httplib::Error::Success) {
    // One reason per kind, so the report groups them; the chunk count is in the JSON.
    if (status == 200 && err == httplib::Error::Read)
      r.error = "connection: closed mid-stream";
    else if (err == httplib::Error::Connection)
      r.error = "connection: could not connect to " + target_.scheme_host_port;
    else
      r.error = "connection: " + httplib::to_string(err) + (status == 200 ? " mid-stream" : "");
    reset();  // the connection is in an unknown state
  } else if (status != 200) {
    r.error = "HTTP " + std::to_string(status) + ": " + error_message(error_body);
  } else if (!stream_error.empty()) {
    r.error = stream_error;
  } else if (!done) {
    r.error = "stream ended without data: [DONE]";
    reset();
  } else if (r.first_token_s < 0) {
    r.error = "stream carried no tokens";
  } else {
    r.ok = true;
  }
  return r;
}

int64_t server_token_count(const BenchTarget& target, const std::string& model, const std::string& text) {
  httplib::Client http(target.scheme_host_port);
  http.set_connection_timeout(5, 0);
  http.set_read_timeout(30, 0);
  httplib::Headers headers;
  if (!target.api_key.empty()) headers.emplace("Authorization", "Bearer " + target.api_key);
  const json body = {{"model", model}, {"prompt", text}};
  // vLLM serves /tokenize at the root; some servers put it under /v1.
  for (const std::string& path : {std::string("/tokenize"), target.api_prefix + "/tokenize"}) {
    auto res = http.Post(path.c_str(), headers, body.dump(), "application/json");
    if (!res || res->status != 200) continue;
    json j = json::parse(res->body, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("count") && j["count"].is_number_integer()) return j["count"].get<int64_t>();
    if (j.contains("tokens") && j["tokens"].is_array()) return int64_t(j["tokens"].size());
  }
  return -1;
}

}  // namespace moonrun::tools
