#pragma once
// The OpenAI-compatible HTTP front end (cpp-httplib): routes, Bearer auth, request limits,
// OpenAI error envelopes for every failure, SSE streaming with client-disconnect aborts.
//
//   GET  /health               200 while the engine loop is alive, else 503 (no auth)
//   GET  /v1/models            the served model with max_model_len
//   POST /v1/chat/completions  chat (reasoning_content, tool_calls), streamed or not
//   POST /v1/completions       raw prompt (text or token ids), streamed or not
//   POST /tokenize, /detokenize
//   GET  /metrics              Prometheus text
#include <atomic>
#include <memory>

#include "common/status.h"
#include "server/serving_context.h"

namespace httplib {
class Server;
}

namespace moonrun::server {

class HttpServer {
 public:
  explicit HttpServer(const ServingContext& ctx);
  ~HttpServer();

  // Binds host:port; fails with a one-line message when the port is taken.
  Status bind();
  int port() const { return port_; }
  // Serves until stop(); call from the thread that should run the accept loop.
  void serve();
  void stop();
  // While draining, new generation requests get 503; running ones finish.
  void set_draining(bool draining) { draining_ = draining; }

 private:
  void install_routes();
  const ServingContext& ctx_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> draining_{false};
  int port_ = 0;
};

}  // namespace moonrun::server
