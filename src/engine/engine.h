#pragma once
// The engine core: requests in, one batched forward per step, tokens out. Single-threaded
// (EngineLoop runs it on its own thread and is the thread-safe face the server uses).
//
//   Status Engine::step(outputs):
//     schedule()        which requests run, how many tokens each (scheduler.h)
//     prepare_inputs()  the ForwardBatch: new token ids, positions, page tables, KDA slots
//     forward()         the ModelRunner: logits, one row per scheduled request
//     sample()          a token for each request whose step reached its last known token
//     postprocess()     append, detokenise, stop conditions, outputs; free what finished
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/cache_manager.h"
#include "common/status.h"
#include "engine/output_text.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "engine/scheduler.h"
#include "model/forward_batch.h"
#include "runtime/model_runner.h"

namespace moonrun {

struct EngineConfig {
  SchedulerConfig scheduler;
  int max_model_len = 0;                // context length: prompt + output tokens per request
  std::vector<int32_t> eos_token_ids;   // stop generation unless params.ignore_eos
  uint64_t seed = 0;                    // seeds the generators of requests without a seed
  // Which ids are special tokens: with params.skip_special_tokens they add no text (they
  // stay in the ids). Empty: none is. E.g. [tok](int32_t id) { return tok->is_special(id); }.
  std::function<bool(int32_t)> is_special_token;
};

// What a client's request produced since the last output (one per sequence per step, only
// when something happened). The server turns these into SSE chunks or a final response.
struct RequestOutput {
  uint64_t request_id = 0;
  int index = 0;                       // which of the n samples (OpenAI choices[].index)
  std::vector<int32_t> new_token_ids;  // at most one per step today
  std::string text_delta;              // UTF-8, whole characters, stop strings cut off
  std::vector<SampleResult> logprobs;  // one per new token when params.logprobs >= 0
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;             // the matched stop string, if any
  Status error;                        // not ok: the request failed (finish_reason kError)
  int num_prompt_tokens = 0;           // usage, cumulative
  int num_output_tokens = 0;
  int num_cached_tokens = 0;           // prompt tokens served from a prefix cache (0 today)
  // When the sequence first ran a step (its queue time ends, its prefill starts); the
  // server's queue/prefill/decode time metrics. Default-constructed if it never ran.
  std::chrono::steady_clock::time_point first_scheduled_time{};
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  CacheStats cache;
  int64_t prompt_tokens_total = 0;      // prompt tokens of admitted requests
  int64_t generation_tokens_total = 0;  // sampled tokens
  int64_t preemptions_total = 0;
  int64_t requests_finished_total = 0;
  int64_t steps_total = 0;
};

// The configuration errors a user can make (--context-length larger than the KV pool, ...),
// as one-line messages; the Engine constructor assumes they were checked.
Status check_engine_config(const EngineConfig& config, const CacheConfig& cache);

class Engine {
 public:
  // The cache and runner outlive the engine. max_model_len must fit the cache pool;
  // max_running_requests is capped at the number of KDA slots.
  Engine(const EngineConfig& config, CacheManager& cache, ModelRunner& runner, DetokenizeFn detokenize);

  // Checks a request against the limits (thread-safe: reads only the fixed configuration).
  // invalid_argument for bad params or token ids, out_of_range for the context length.
  Status validate(const std::vector<int32_t>& prompt_ids, const SamplingParams& params) const;
  // Validates and queues params.n sequences under request_id (which must be new).
  Status add_request(uint64_t request_id, std::vector<int32_t> prompt_ids, const SamplingParams& params);
  // Frees the request's caches now and emits its finished (kAbort) outputs. No-op if unknown.
  void abort_request(uint64_t request_id, std::vector<RequestOutput>& outputs);
  // Ends every request with error (finish_reason kError): the engine cannot go on.
  void fail_all(const Status& error, std::vector<RequestOutput>& outputs);

  bool has_work() const { return !requests_.empty(); }
  bool has_request(uint64_t request_id) const { return groups_.count(request_id) != 0; }
  Status step(std::vector<RequestOutput>& outputs);

  EngineStats stats() const;
  const EngineConfig& config() const { return config_; }
  const Scheduler& scheduler() const { return scheduler_; }

 private:
  SchedulerOutput schedule();
  ForwardBatch prepare_inputs(const SchedulerOutput& scheduled);
  Status forward(const ForwardBatch& batch, std::vector<float>& logits);
  std::vector<std::optional<SampleResult>> sample(const SchedulerOutput& scheduled,
                                                  const std::vector<float>& logits);
  void postprocess(const SchedulerOutput& scheduled,
                   const std::vector<std::optional<SampleResult>>& samples,
                   std::vector<RequestOutput>& outputs);

  RequestOutput finish(Request* req, FinishReason reason, std::string text_delta);
  bool is_eos(int32_t token) const;

  EngineConfig config_;
  CacheManager& cache_;
  ModelRunner& runner_;
  DetokenizeFn detokenize_;
  Scheduler scheduler_;
  std::mt19937_64 seed_gen_;
  int64_t next_seq_id_ = 0;
  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;  // by seq_id
  std::unordered_map<uint64_t, std::vector<int64_t>> groups_;       // request_id -> seq ids
  EngineStats totals_;
};

}  // namespace moonrun
