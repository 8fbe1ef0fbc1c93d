#pragma once
// The OpenAI-compatible HTTP front end: an Asio event loop with Boost.Beast's HTTP/1.1
// parser reads requests (deadlines, size limits, strict framing: client_connection.h), a
// pool of worker threads answers them (routes.h), and SIGTERM drains it (shutdown()).
//
//   GET  /health               200 while the engine loop is alive, else 503 (open)
//   GET  /metrics              Prometheus text, vLLM's names (open; --protect-metrics)
//   GET  /v1/models            the served model with max_model_len
//   POST /v1/chat/completions  chat (reasoning_content, tool_calls), streamed or not
//   POST /v1/completions       raw prompt (text or token ids), streamed or not
//   POST /tokenize, /detokenize
//   OPTIONS *                  CORS preflight (open)
#include <atomic>
#include <chrono>
#include <memory>

#include "common/status.h"
#include "server/serving_context.h"

namespace moonrun::server {

class HttpServer {
 public:
  explicit HttpServer(const ServingContext& ctx);
  ~HttpServer();

  // Binds host:port and listens (--backlog); fails with a one-line message when the port
  // is taken.
  Status bind();
  int port() const;
  // Runs the event loop until stop(); call from the thread that should run it.
  void serve();
  void stop();
  // SIGTERM: stop accepting, answer new requests 503 + Connection: close, let in-flight
  // requests run until `timeout`, then cut those left (a final SSE error event and [DONE]
  // for streams, 503 for the others), give their answers a second to go out, close every
  // connection and stop(). Returns how many requests were cut. Any thread.
  int shutdown(std::chrono::duration<double> timeout);
  void set_draining(bool draining);
  int in_flight() const;
  int open_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moonrun::server
