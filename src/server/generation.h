#pragma once
// One HTTP request's generation on the engine: submit, collect or stream the outputs,
// record latency metrics, abort when the client goes away.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "server/metrics.h"

namespace moonrun::server {

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
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

class Generation {
 public:
  // Submits; the Status maps to the HTTP error (400 / 503).
  static Result<std::unique_ptr<Generation>> start(EngineLoop& engine, Metrics& metrics,
                                                   std::vector<int32_t> prompt_ids,
                                                   const SamplingParams& params);
  ~Generation();  // aborts when not finished (a dead client)

  // Waits for the next output (up to timeout); false when none came.
  bool next(RequestOutput& out, std::chrono::milliseconds timeout);
  bool done() const { return stream_->done(); }
  void abort();
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
  std::shared_ptr<RequestStream> stream_;
  int n_ = 1;
  Usage usage_;
  bool finished_all_ = false;
  std::chrono::steady_clock::time_point start_, last_token_;
  bool first_token_seen_ = false;
  bool client_gone_seen_ = false;
};

}  // namespace moonrun::server
