#pragma once
// Decides, once per step, which requests run and how many of their tokens get computed.
// vLLM's scheduler (v1/core/sched/scheduler.py) in its plain FCFS form:
//   - a budget of max_tokens_per_step tokens (--chunked-prefill-size) per step;
//   - running requests first: the decodes (one token each), then the prefill chunks, each
//     group in admission order; each asks for all its uncomputed tokens capped by the
//     budget left, so a long prompt is prefilled in chunks while every running stream keeps
//     decoding between them (SGLang's and vLLM's mixed chunked prefill);
//   - when the cache cannot hold a request's tokens, the most recently admitted running
//     request not yet scheduled this step is preempted (caches freed, back to the head of
//     the waiting queue, recompute later) until it fits; if that is the request itself, it
//     waits;
//   - then, if nobody was preempted this step, waiting requests join in arrival order while
//     the budget, the cache and --max-running-requests allow. The first that does not fit
//     stops admission (FCFS: a small request never overtakes a larger one ahead of it).
//   - fair chunking (issue 47): with an attention budget set for the step, a prefill chunk
//     is also cut so that its query-key pairs (n tokens after p cached ones: n * p + n (n +
//     1) / 2, the work that grows with the context) stay within it, so a chunk late in a
//     long prompt is short and the other streams' decodes are not held for seconds
//     (--max-prefill-attention-pairs; docs/architecture.md says why a work budget).
//   - prefix caching (cache_manager.h): a newcomer whose prompt starts with a cached prefix
//     starts after it; prefill chunks end at a block boundary where the state should be
//     snapshotted for later requests (the cache says where).
// Pure logic over token counts and the cache manager: the unit tests drive it without a
// model.
#include <climits>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "cache/cache_manager.h"
#include "common/status.h"
#include "engine/request.h"
#include "runtime/defaults.h"

namespace moonrun {

struct SchedulerConfig {
  int max_running_requests = defaults::kMaxRunningRequests;
  int max_tokens_per_step = defaults::kChunkedPrefillTokens;  // <= 0: no chunking; raised to max_running_requests if below
  int max_queued_requests = -1;    // waiting-queue limit for new requests; -1: none
  // The query-key pairs a step's prefill chunks may attend over together, per attention
  // layer (<= 0: no bound; see "fair chunking" above).
  int64_t max_prefill_attention_pairs = 0;
};

struct ScheduledSeq {
  Request* req = nullptr;
  int n_new_tokens = 0;  // tokens [num_computed, num_computed + n_new) are computed
  bool samples = false;  // the step reaches the request's last known token: sample one more
  int n_draft = 0;       // of the n_new tokens, the last n_draft are the request's draft_ids
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;  // running requests first, then newly admitted ones
  std::vector<Request*> preempted;
  int n_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, CacheManager& cache);

  // Queues a new request; resource_exhausted when the waiting queue is full.
  Status add(Request* req);
  SchedulerOutput schedule();
  // A prefill chunk gets at least this many tokens under the attention budget, so a prompt
  // always advances.
  static constexpr int kMinFairChunkTokens = 32;
  // A paced prompt's next chunk is at most this many times its last paced one. Its chunks can
  // only shrink as its prefix grows (each token attends over more), so a chunk much larger
  // than the last is a cost model gone wrong (the pacer's fit is ill-conditioned when every
  // step sits at the target), and one such chunk late in a 1M prompt is a 1 s stall. The
  // margin lets a chunk cut too short (a step with more decodes, a pessimistic fit) recover.
  static constexpr double kMaxFairChunkGrowth = 1.25;
  // A prompt counts as alone only after this many steps without company. Streams that end
  // together and come back with their next request a few milliseconds later leave the
  // prompt alone for a step or two; an unpaced chunk there (8,192 tokens late in a 1M
  // prompt: ~1.1 s) was every such stream's next wait, 1 % of their gaps (the p99 of
  // bench/long_prompt_serve.py's 8 streams). 64 paced steps are ~2 s at a 30 ms target.
  static constexpr int kFairCompanySteps = 64;
  // Fair chunking by time (engine/prefill_pacer.h): this step's prefill may cost `budget`
  // (seconds, say) with a cost of per_token a token and per_pair a query-key pair; the
  // decodes scheduled first spend per_token each from it. per_pair <= 0 (no pacer yet): the
  // config's max_prefill_attention_pairs alone (a budget of pairs at one a pair); budget <= 0
  // with a pair's cost: no room this step (the minimum chunk), never "no bound".
  struct PrefillBudget {
    double budget = 0, per_token = 0, per_pair = 0;
    // The pacer's: a chunk's cost per cached position before it (paid whatever its length:
    // per_pair x context pairs), and the step's fixed part; fair_chunk gives a chunk at least
    // their sum of work.
    double per_context = 0, fixed = 0;
  };
  void set_prefill_budget(const PrefillBudget& b) { paced_ = b; }
  // The attention pairs of n new tokens after `past` ones.
  static int64_t attention_pairs(int64_t past, int64_t n) { return n * past + n * (n + 1) / 2; }
  // The prefill lane's next chunk of a running request (Engine, runtime/prefill_lane.h): up
  // to max_tokens of its uncomputed tokens, cut at a snapshot boundary, its pages allocated
  // (never by preempting anyone) and its snapshot planned. n_new_tokens 0: the cache has no
  // room now. The caller marks it in_lane until the chunk is done.
  ScheduledSeq schedule_lane(Request* req, int max_tokens);
  // The prefill lane's newcomer: the oldest waiting request, when its prompt has at least
  // min_prompt_tokens and no images, admitted as schedule() admits one (its cached prefix
  // shared, its slot zeroed or restored: the coming slot commands) with its first chunk of up
  // to max_tokens for the lane, so that no shared step carries any of its prompt. Only the
  // head of the queue (arrival order holds) and only under the running-request cap; req null
  // when there is none or no room.
  ScheduledSeq admit_to_lane(int max_tokens, int min_prompt_tokens);
  // After the forward: the scheduled tokens are in the caches now.
  void on_step_done(const SchedulerOutput& out);
  // Takes a request out (finished or aborted) and frees its caches. Idempotent.
  void remove(Request* req);

  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  const std::deque<Request*>& waiting() const { return waiting_; }
  const std::vector<Request*>& running() const { return running_; }
  int64_t num_preemptions() const { return num_preemptions_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  void preempt(Request* victim);
  // The newest running request that may give its caches back (none on the prefill lane).
  Request* newest_preemptible() const;
  // n_new tokens from `from` (default: the computed ones), cut at a snapshot boundary.
  int chunk(const Request* req, int n_new, int from = -1) const;
  // n_new cut to the budget left at the step's costs (a prefill chunk from `from`), which it
  // spends.
  // cap: the most tokens the chunk may bring (kMaxFairChunkGrowth).
  int fair_chunk(int n_new, int from, const PrefillBudget& cost, double& left, int cap = INT_MAX) const;
  // The cap on req's chunk under `left`, and the chunk it got (recorded when paced).
  int growth_cap(const Request* req, double left) const;
  void record_chunk(const Request* req, int n, double left);
  // Queues a state snapshot when the step ends req's chunk at an uncached block boundary.
  void plan_snapshot(const Request* req, int n_new);
  // The head of the queue, its cached prefix matched and its first n_new tokens' pages
  // allocated, becomes a running request (schedule()'s newcomers, admit_to_lane).
  void admit_head(int cached, int n_new);

  SchedulerConfig config_;
  CacheManager& cache_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // admission order
  int64_t num_preemptions_ = 0;
  PrefillBudget paced_;
  std::unordered_map<int64_t, int> last_paced_chunk_;  // seq_id -> its last chunk cut by the budget
  int steps_alone_ = kFairCompanySteps;  // schedule() calls since more than one request was in
};

}  // namespace moonrun
