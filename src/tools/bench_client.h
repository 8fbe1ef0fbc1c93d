#pragma once
// One streaming request to an OpenAI-compatible server (moonrun, vLLM, SGLang), timed:
// the time of every streamed chunk that carries text, the usage the server reports, and
// why it failed when it did. Server-Sent Events over cpp-httplib's streaming receiver.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace httplib {
class Client;
}

namespace moonrun::tools {

using BenchClock = std::chrono::steady_clock;

enum class BenchEndpoint { kChat, kCompletions };

// Where to send: "http://host:port" or "http://host:port/v1" (the /v1 is added if missing).
struct BenchTarget {
  std::string scheme_host_port;  // "http://127.0.0.1:8000"
  std::string api_prefix;        // "/v1"
  std::string api_key;           // sent as "Authorization: Bearer KEY" when not empty
  BenchEndpoint endpoint = BenchEndpoint::kChat;
  double timeout_s = 600;
};
// Splits --base-url; returns an error message, or "" when the URL is usable.
std::string parse_base_url(const std::string& url, BenchTarget* target);

struct BenchPrompt {
  std::string text;             // the prompt (a single user message for chat)
  nlohmann::json messages;      // chat messages from a dataset line; null = use text
  int64_t max_tokens = 0;       // the request's output length
};

// What one request measured. Times are seconds from the run's start.
struct RequestResult {
  int64_t index = 0;
  bool ok = false;
  std::string error;                 // "HTTP 500: ...", "connection: ...", "stream ended ..."
  double start_s = 0, first_token_s = -1, end_s = 0;
  std::vector<double> chunk_times_s;  // every streamed chunk carrying text (or reasoning)
  int64_t completion_tokens = 0;     // from usage when the server sent it, else = chunks
  int64_t prompt_tokens = -1;        // from usage; -1 = not reported
  bool usage_reported = false;
  int64_t n_chunks() const { return int64_t(chunk_times_s.size()); }
};

// The body for one request: streaming, with usage requested in the final chunk.
nlohmann::json bench_request_body(const BenchTarget& target, const std::string& model,
                                  const BenchPrompt& prompt, bool ignore_eos);

// Parses an SSE byte stream incrementally: feed() bytes as they arrive; each complete
// `data:` event is handed to the event callback (the payload without "data: ").
class SseParser {
 public:
  template <typename F>
  void feed(const char* data, size_t n, F&& on_event) {
    buf_.append(data, n);
    size_t pos;
    // Events end with a blank line; accept \n\n and \r\n\r\n.
    while ((pos = next_boundary()) != std::string::npos) {
      std::string event = buf_.substr(0, pos);
      buf_.erase(0, pos + boundary_len_);
      std::string payload;
      size_t start = 0;
      while (start <= event.size()) {
        size_t end = event.find('\n', start);
        std::string line = event.substr(start, end == std::string::npos ? std::string::npos : end - start);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.rfind("data:", 0) == 0) {
          std::string v = line.substr(5);
          if (!v.empty() && v[0] == ' ') v.erase(0, 1);
          payload += (payload.empty() ? "" : "\n") + v;
        }
        if (end == std::string::npos) break;
        start = end + 1;
      }
      if (!payload.empty()) on_event(payload);
    }
  }
  size_t pending_bytes() const { return buf_.size(); }

 private:
  size_t next_boundary() {
    size_t a = buf_.find("\n\n"), b = buf_.find("\r\n\r\n");
    if (b != std::string::npos && (a == std::string::npos || b < a)) {
      boundary_len_ = 4;
      return b;
    }
    boundary_len_ = 2;
    return a;
  }
  std::string buf_;
  size_t boundary_len_ = 2;
};

// One connection (keep-alive) used by one worker for many requests.
class BenchClient {
 public:
  explicit BenchClient(const BenchTarget& target);
  ~BenchClient();
  // Sends `body` and streams the reply; `t0` is the run's start for the result's times.
  RequestResult run(int64_t index, const nlohmann::json& body, BenchClock::time_point t0);

 private:
  void reset();
  BenchTarget target_;
  std::unique_ptr<httplib::Client> http_;
};

// GET /tokenize-style helper: the server's token count for `text`, or -1 when the server
// has no tokenize endpoint (vLLM and SGLang expose POST /tokenize).
int64_t server_token_count(const BenchTarget& target, const std::string& model, const std::string& text);

}  // namespace moonrun::tools
