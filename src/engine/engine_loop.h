#pragma once
// The engine on its own thread, and the thread-safe API the HTTP server uses.
//
//   auto loop = EngineLoop::create(config, std::move(cache), std::move(runner), detokenize);
//   MR_RETURN_IF_ERROR(loop->start());
//   // per HTTP request (any thread):
//   Result<std::shared_ptr<RequestStream>> s = loop->submit(prompt_ids, params);
//   //   invalid_argument -> 400, out_of_range -> 400 context_length_exceeded,
//   //   resource_exhausted -> 503 (queue full), unavailable -> 503 (draining or dead)
//   std::shared_ptr<RequestStream> stream = *s;
//   RequestOutput out;
//   while (!stream->done()) {
//     if (!stream->next(out, std::chrono::milliseconds(100))) {
//       if (client_gone) loop->abort(stream->id());  // ends the stream with kAbort
//       continue;
//     }
//     ... out.index, new_token_ids, text_delta, logprobs, finished, finish_reason, error ...
//   }
//   // health and metrics:
//   loop->alive();   // false once the engine failed: /health answers 503
//   loop->stats();   // running/waiting, cache use, token and preemption counters
//   // SIGTERM: loop->begin_drain(); wait for stats().num_running + num_waiting == 0 (or a
//   // timeout); loop->stop();
//
// Each stream yields, for each of the params.n samples (out.index), outputs until one with
// finished = true; done() is true once all n finished and were taken. If the engine fails
// (a backend error, or any exception inside the loop), every pending request gets a final
// output with finish_reason kError and a non-ok error, later submits fail with
// unavailable, and alive() turns false: nothing is left hanging. No exception crosses from
// the loop thread to callers.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/cache_manager.h"
#include "engine/engine.h"
#include "runtime/model_runner.h"

namespace moonrun {

// One client request's outputs, in order. Filled by the loop thread, read by one consumer.
class RequestStream {
 public:
  RequestStream(uint64_t id, int n) : id_(id), remaining_(n) {}
  uint64_t id() const { return id_; }
  // Waits up to timeout for the next output; false when none came.
  bool next(RequestOutput& out, std::chrono::milliseconds timeout);
  // Every sample has finished and its last output was taken.
  bool done() const;

  void push(RequestOutput out);  // loop thread
  bool all_finished() const;      // loop thread: every sample's final output was pushed

 private:
  const uint64_t id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  int remaining_;  // samples whose final output has not been pushed yet
};

class EngineLoop {
 public:
  // Takes ownership of the cache and the runner (the runner holds the pools the cache hands out).
  static Result<std::unique_ptr<EngineLoop>> create(const EngineConfig& config,
                                                    std::unique_ptr<CacheManager> cache,
                                                    std::unique_ptr<StepRunner> runner,
                                                    DetokenizeFn detokenize);
  ~EngineLoop();  // stop()

  Status start();
  // Aborts whatever is left (finish_reason kAbort) and joins the thread. Idempotent.
  void stop();
  // Refuse new requests (unavailable); running and waiting ones go on.
  void begin_drain() { accepting_ = false; }

  // images: the prompt's images (its ids hold their expanded placeholder runs), or none.
  Result<std::shared_ptr<RequestStream>> submit(std::vector<int32_t> prompt_ids, const SamplingParams& params,
                                                std::shared_ptr<const vision::PromptImages> images = nullptr);
  // The request's caches are freed before the next step; its stream ends with kAbort.
  void abort(uint64_t request_id);

  bool alive() const { return alive_; }
  EngineStats stats() const;
  const EngineConfig& config() const { return engine_->config(); }
  const CacheConfig& cache_config() const { return cache_->config(); }
  int vocab() const { return runner_->vocab(); }

 private:
  EngineLoop() = default;
  void run();
  void deliver(std::vector<RequestOutput>& outputs);
  void die(const Status& error);

  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<Engine> engine_;  // touched only by the loop thread once started

  struct Submission {
    uint64_t id;
    std::vector<int32_t> prompt_ids;
    SamplingParams params;
    std::shared_ptr<const vision::PromptImages> images;
  };
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Submission> inbox_;
  // Submissions that submit() admitted but the engine could not queue yet (preemptions grew
  // its waiting queue in between): the loop retries them first. Never refused afterwards,
  // so an admitted request never turns into an error inside a 200 stream.
  std::deque<Submission> deferred_;  // loop thread only
  int deferred_seqs_ = 0;            // their sequences, for submit()'s count (under mu_)
  std::vector<uint64_t> aborts_;
  std::unordered_map<uint64_t, std::shared_ptr<RequestStream>> streams_;
  EngineStats stats_;
  uint64_t next_id_ = 1;
  bool stop_requested_ = false;

  std::atomic<bool> alive_{false};
  std::atomic<bool> accepting_{true};
  std::thread thread_;
};

}  // namespace moonrun
