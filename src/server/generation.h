#pragma once
// One HTTP request's generation on the engine: submit, collect or stream the outputs,
// record latency metrics and the request's log fields, abort when the client goes away or
// the server's shutdown deadline cuts it.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "server/metrics.h"

namespace moonrun::server {

class Generation;

// What the HTTP layer knows about the request a worker thread is answering: its id, the
// fields of its log line, and its live generations (so SIGTERM's deadline can cut them).
// The server makes one per request and sets it as the thread's current request while the
// handler and its stream run; Generation::start finds it there, so handlers need not pass it.
struct RequestRecord {
  std::string id;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
  std::mutex mu;  // guards everything below
  int prompt_tokens = -1;      // -1: not a generation
  int completion_tokens = -1;
  double queue_s = -1, ttft_s = -1;
  // Speculative decoding over the request's sequences: verify steps, drafts, accepted drafts.
  int spec_steps = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  std::vector<Generation*> live;
  bool cut = false;  // the shutdown deadline passed: generations end as "server shutting down"
  void cut_all();
};
RequestRecord* current_request();
class ScopedCurrentRequest {
 public:
  explicit ScopedCurrentRequest(RequestRecord* record);
  ~ScopedCurrentRequest();

 private:
  RequestRecord* previous_;
};

// What one of the n samples produced, in full.
struct SampleOutcome {
  std::vector<int32_t> token_ids;
  std::vector<std::string> text_pieces;  // one per engine output, in order (whole characters)
  std::vector<int> piece_tokens;         // tokens behind each piece
  std::string text;                      // the pieces joined
  std::vector<SampleResult> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;
};

struct Usage {
  int prompt_tokens = 0;  // image rows included (each is a position, as in vLLM)
  int completion_tokens = 0;
  int cached_tokens = 0;
  int image_tokens = 0;   // the prompt's image rows (prompt_tokens_details.image_tokens)
};

class Generation {
 public:
  // Submits; the Status maps to the HTTP error (400 / 503).
  static Result<std::unique_ptr<Generation>> start(EngineLoop& engine, Metrics& metrics,
                                                   std::vector<int32_t> prompt_ids,
                                                   const SamplingParams& params,
                                                   std::shared_ptr<const vision::PromptImages> images = nullptr);
  ~Generation();  // aborts when not finished (a dead client)

  // Waits for the next output (up to timeout); false when none came.
  bool next(RequestOutput& out, std::chrono::milliseconds timeout);
  bool done() const { return stream_->done(); }
  void abort();
  // The server's shutdown deadline passed: abort, and report it as such (503 / an SSE error
  // event), not as a client disconnect. Any thread.
  void cut();
  bool was_cut() const { return cut_; }
  // Blocks until every sample finished; fails with the engine's error if it failed.
  // client_gone (optional) is asked about every kClientCheckInterval while waiting; once it
  // says yes the request is aborted (its caches are freed before the engine's next step),
  // collect() returns unavailable, and client_gone_seen() is true.
  Result<std::vector<SampleOutcome>> collect(const std::function<bool()>& client_gone = nullptr);
  bool client_gone_seen() const { return client_gone_seen_; }
  // How often a waiting handler asks whether its client is still there: well under one
  // engine step (a decode step is tens of ms on K3), and one poll() call each time.
  static constexpr std::chrono::milliseconds kClientCheckInterval{10};
  const Usage& usage() const { return usage_; }
  int n() const { return n_; }

 private:
  Generation() = default;
  void account(const RequestOutput& out);
  EngineLoop* engine_ = nullptr;
  Metrics* metrics_ = nullptr;
  RequestRecord* record_ = nullptr;
  std::shared_ptr<RequestStream> stream_;
  int n_ = 1;
  Usage usage_;
  bool finished_all_ = false;
  std::chrono::steady_clock::time_point start_, last_token_, first_token_, first_scheduled_;
  bool first_token_seen_ = false;
  bool client_gone_seen_ = false;
  std::atomic<bool> cut_{false};
};

// The error a cut request gets (503, code "server_shutting_down").
Status shutdown_cut_status();

}  // namespace moonrun::server
