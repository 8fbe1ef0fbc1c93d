#pragma once
// The engine core: requests in, one batched forward per step, tokens out. Single-threaded
// (EngineLoop runs it on its own thread and is the thread-safe face the server uses).
//
//   Status Engine::step(outputs):
//     schedule()        which requests run, how many tokens each (scheduler.h)
//     prepare_inputs()  the StepInput: new token ids, page tables, state slots and their
//                       commands, a sampling row for each request whose step reaches its end
//     forward()         the runner (runtime/model_runner.h): forward + sampling on the device
//     postprocess()     append, detokenise, stop conditions, outputs; free what finished
#include <chrono>
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
#include "engine/draft_source.h"
#include "engine/output_text.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/prefill_pacer.h"
#include "engine/spec_balance.h"
#include "runtime/model_runner.h"
#include "runtime/sampling_params.h"

namespace moonrun {

struct EngineConfig {
  SchedulerConfig scheduler;
  int max_model_len = 0;                // context length: prompt + output tokens per request
  std::vector<int32_t> eos_token_ids;   // stop generation unless params.ignore_eos
  uint64_t seed = 0;                    // seeds the generators of requests without a seed
  // Which ids are special tokens: with params.skip_special_tokens they add no text (they
  // stay in the ids). Empty: none is. E.g. [tok](int32_t id) { return tok->is_special(id); }.
  std::function<bool(int32_t)> is_special_token;
  // Speculative decoding (off by default). The cache needs verify slots when the model keeps
  // a recurrent state (CacheConfig::num_verify_slots).
  SpeculativeConfig speculative;
  // Pad every verifying sequence's drafts to the step's longest (a filler token, verified like
  // any draft, so nothing changes but the work): a step whose sequences all bring 1 + k
  // tokens replays a CUDA graph, a ragged one runs eagerly. On where the runner captures.
  bool pad_drafts = false;
  // Without a disable_by_batch_size, stand aside where speculation measures slower than plain
  // decoding at the current batch size (engine/spec_balance.h). On for CUDA, where a step's
  // time is the GPU's; the CPU backend's steps cost (1 + k)x and tests want their drafts.
  bool auto_stand_aside = false;
  // Fair chunking by time (--max-prefill-step-ms; engine/prefill_pacer.h): a step carrying a
  // prefill chunk is cut to take about this long, from the step costs the engine measures.
  // 0: off (the scheduler's max_prefill_attention_pairs alone).
  double max_prefill_step_ms = 0;
  // Query-key pairs of work a cached position costs a prefill chunk after it, whatever the
  // chunk's length (engine/prefill_pacer.h; prefill_context_pairs_of(ModelConfig)).
  double prefill_context_pairs = 0;
  // The prefill lane (--prefill-lane-min-tokens; runtime/prefill_lane.h): a prompt of at least
  // this many tokens has its chunks after the first prefilled on the runner's second lane, in
  // chunks of prefill_lane_chunk_tokens, beside the other streams' steps. 0: off; also off
  // when the runner has no lane.
  int prefill_lane_min_tokens = 0;
  int prefill_lane_chunk_tokens = 0;
  // While a chunk is on the lane, a step starts at most every this many ms (0: back to back):
  // the others' inter-token latency traded for the long prompt's share of the device.
  double prefill_lane_step_ms = 0;
  // Seconds on a monotonic clock (tests substitute a model of step costs); empty: steady_clock.
  std::function<double()> clock;
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
  int num_cached_tokens = 0;           // prompt tokens served from the prefix cache
  // Speculative decoding, cumulative: steps that verified drafts, drafts, accepted drafts.
  int num_spec_steps = 0;
  int num_draft_tokens = 0;
  int num_accepted_draft_tokens = 0;
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
  // Speculative decoding (vLLM's spec_decode metrics): verifications (one per sequence and
  // step that brought drafts), draft tokens, accepted ones, and accepted ones by position.
  int64_t spec_num_drafts_total = 0;
  int64_t spec_draft_tokens_total = 0;
  int64_t spec_accepted_tokens_total = 0;
  std::vector<int64_t> spec_accepted_per_position;
  // Steps with sequences decoding, speculation configured, that verified no draft: the
  // measured balance stood aside (spec_balance.h), or it did not and no sequence had a draft.
  int64_t spec_stand_aside_steps_total = 0;
  int64_t spec_steps_without_drafts_total = 0;
};

// The configuration errors a user can make (--context-length larger than the KV pool, ...),
// as one-line messages; the Engine constructor assumes they were checked.
Status check_engine_config(const EngineConfig& config, const CacheConfig& cache);
// `wanted` with max_model_len resolved (0: the model's max_position_embeddings, capped by
// the KV pool) and checked against the cache.
Result<EngineConfig> resolve_engine_config(EngineConfig wanted, int64_t model_max_len, const CacheConfig& cache);

class Engine {
 public:
  // The cache and runner outlive the engine. max_model_len must fit the cache pool;
  // max_running_requests is capped at the number of state slots.
  Engine(const EngineConfig& config, CacheManager& cache, StepRunner& runner, DetokenizeFn detokenize);
  ~Engine();  // waits for a prefill-lane chunk in flight (it reads this engine's step input)

  // Checks a request against the limits (thread-safe: reads only the fixed configuration).
  // invalid_argument for bad params or token ids, out_of_range for the context length.
  Status validate(const std::vector<int32_t>& prompt_ids, const SamplingParams& params) const;
  // Validates and queues params.n sequences under request_id (which must be new). With
  // images, prompt_ids holds each image's expanded placeholder run (vision/placeholders.h);
  // the vision tower runs here, once for the n samples.
  Status add_request(uint64_t request_id, std::vector<int32_t> prompt_ids, const SamplingParams& params,
                     std::shared_ptr<const vision::PromptImages> images = nullptr);
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
  // Drafts for the sequences that decode next step (speculative decoding).
  Status propose_drafts();
  void pad_drafts();
  double now_seconds() const;
  SchedulerOutput schedule();
  void prepare_inputs(const SchedulerOutput& scheduled, StepInput& input);
  // The request's sampling row `ahead` tokens past its output (a draft's row): its params,
  // min_tokens bans, and the mask of `constraint` (the request's, or a copy advanced over
  // the drafts before the row; null: no structured output).
  void add_sampling_row(Request& req, SamplingBatch& sampling, int ahead, TokenConstraint* constraint);
  Status forward(const StepInput& input, StepOutput& output);
  void postprocess(const SchedulerOutput& scheduled, const StepOutput& result, std::vector<RequestOutput>& outputs);

  RequestOutput finish(Request* req, FinishReason reason, std::string text_delta);
  bool is_eos(int32_t token) const;
  // A live sequence's prompt (empty once it is gone): what a committed snapshot caches.
  std::span<const int32_t> prompt_of(int64_t seq) const;

  // The prefill lane (EngineConfig::prefill_lane_min_tokens, runtime/prefill_lane.h): one
  // request's chunk at a time, with what the lane reads until it is collected.
  struct LaneJob {
    Request* req = nullptr;
    SchedulerOutput scheduled;  // the one chunk, as a step's
    std::vector<int32_t> tokens, pages;
    StepInput input;
    StepOutput output;
    std::vector<CacheManager::PendingSnapshot> snapshots;  // committed when it is done
  };
  PrefillLane* lane() const;
  // Starts the next lane chunk when the lane is idle: the oldest running request whose prompt
  // is long enough and still has chunks to go, else the oldest waiting one (admitted onto the
  // lane with its first chunk: Scheduler::admit_to_lane).
  Status start_lane();
  Status submit_lane(const ScheduledSeq& s);
  // When the lane's chunk is done within `wait`: its tokens as a step's (postprocess).
  Status collect_lane(std::vector<RequestOutput>& outputs, std::chrono::microseconds wait);

  EngineConfig config_;
  CacheManager& cache_;
  StepRunner& runner_;
  DetokenizeFn detokenize_;
  Scheduler scheduler_;
  std::unique_ptr<DraftSource> drafts_;  // null: no speculation
  SpecBalance balance_;                   // config_.auto_stand_aside's measurements
  PrefillPacer pacer_;                    // config_.max_prefill_step_ms's measurements
  bool step_speculates_ = false;          // this step's verdict (propose_drafts)
  int step_decoding_ = 0;                 // sequences decoding at this step's start
  std::mt19937_64 seed_gen_;
  int64_t next_seq_id_ = 0;
  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;  // by seq_id
  std::unordered_map<uint64_t, std::vector<int64_t>> groups_;       // request_id -> seq ids
  EngineStats totals_;
  std::vector<int32_t> banned_;                    // EOS and stop tokens (min_tokens), per row
  std::vector<uint32_t> mask_;                     // a constraint's allowed tokens, per row
  std::vector<std::vector<int32_t>> step_tokens_;  // each scheduled sequence's new tokens this step
  std::vector<std::vector<int32_t>> step_given_;   // each one's image rows among them (StepSeq::given_at)
  std::vector<int> spec_first_row_;                // each one's first saved row when it verifies drafts, else -1
  std::unique_ptr<LaneJob> lane_job_;              // the prefill lane's chunk in flight
  Status lane_failure_ = Status::ok();             // a lane failure met outside step(): step() reports it
  double last_step_start_ = 0;                     // now_seconds() at the last step's start
};

}  // namespace moonrun
