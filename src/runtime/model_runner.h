#pragma once
// The one thing the engine needs from a model: run one step and return token ids.
//
//   StepInput  the scheduled sequences: each one's new tokens (a prefill chunk or the last
//              sampled token), where its caches are (state slot, page table) and, when
//              the step reaches its end, its sampling row; the state-slot commands of
//              the step (zero or restore before the forward, snapshot after it).
//   StepOutput one SampleResult per sampling sequence (token, and logprobs when asked);
//              the logits themselves only when the caller asks (tests, `generate`).
//
// ModelRunner (the class below) implements it for any backend: it builds the flat
// ForwardBatch once, uploads it, runs the model's forward on the ops (as a CUDA graph per
// batch-size bucket for decode steps where the backend captures), and samples on the
// device. The engine tests implement the interface with a fake model.
#include <climits>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/op_profile.h"
#include "backend/ops.h"
#include "backend/sampling.h"
#include "cache/cache_manager.h"
#include "common/status.h"
#include "model/dspark_draft.h"
#include "model/model.h"
#include "runtime/prefill_lane.h"

namespace moonrun {

struct StepSeq {
  std::span<const int32_t> new_token_ids;  // positions [n_past, n_past + n)
  int n_past = 0;
  int state_slot = -1;
  std::span<const int32_t> pages;  // covers n_past + n tokens
  bool sample = false;             // pick a token after the last new one (its row in StepInput::sampling)
  bool all_logits = false;         // logits for every new token (StepInput::return_logits)
  // Speculative decoding: the last n_draft new tokens are draft tokens to verify. With
  // `sample`, the step samples a row after each of the last n_draft + 1 new tokens (rows
  // n_draft + 1 of StepInput::sampling, in order), and saves what a rollback of the
  // recurrent state to any prefix of its new tokens needs (StateReplay, next step).
  int n_draft = 0;
  // Input rows given instead of embedding lookups (an image's rows from the vision tower):
  // new token given_at[i] takes row i of given_rows, [given_at.size(), hidden] F32.
  std::span<const int32_t> given_at;
  std::span<const float> given_rows;
};

// Speculative decoding's rollback, run before the step's state copies: restore `slot` from
// `snapshot` (the state before the last step verified drafts), then advance it over
// n_tokens of the rows that step saved, from saved row first_row on (the tokens accepted).
struct StateReplay {
  int slot = -1;
  int snapshot = -1;
  int first_row = 0;
  int n_tokens = 0;
};

struct StepInput {
  std::vector<StepSeq> seqs;
  SamplingBatch sampling;  // one row per seq with sample (1 + n_draft for a verifying one), in order
  std::vector<StateReplay> replays;  // before everything else
  std::vector<StateCopy> before, after;
  bool return_logits = false;  // copy the logits rows to StepOutput::logits
};

struct StepOutput {
  std::vector<SampleResult> samples;  // one per sampling row (1 + n_draft per sampling seq), in order
  std::vector<float> logits;          // [rows, vocab] when asked: each seq's logit rows, in order
};

// What a runner has done so far (tests and benchmarks read it).
struct RunnerStats {
  int64_t steps = 0;
  int64_t graph_replays = 0;    // decode steps replayed from a captured graph
  int64_t tokens_computed = 0;  // new tokens through the model, all steps
  int64_t micro_batches = 0;    // pipeline micro-batches run (steps split into several)
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // A non-ok Status means the backend failed; the engine then fails every pending request.
  virtual Status step(const StepInput& input, StepOutput& output) = 0;
  virtual int vocab() const = 0;
  virtual RunnerStats stats() const { return {}; }
  // Bytes the backend can still hand out (a device arena's; the CPU answers INT64_MAX).
  virtual int64_t free_bytes() const { return INT64_MAX; }
  // The vision tower's rows for a prompt's images, in prompt order (Model::encode_images),
  // [sum of num_tokens, hidden] F32: what StepSeq::given_rows then carries.
  virtual Result<std::vector<float>> encode_images(std::span<const vision::ImagePatches* const> images) {
    return unimplemented("images: this runner has no vision tower");
  }
  // While set, every step times its ops one by one into *profile (eagerly, no graphs);
  // nullptr turns it off. A group profiles its rank 0. False: this runner cannot.
  virtual bool set_op_profile(OpProfile* profile) { return false; }
  // A draft model's blocks (speculative decoding with a DSpark draft, model/dspark_draft.h):
  // one result per request, in order. Only a runner with a draft attached can.
  // want_logits: each result keeps its drafts' corrected logits (tests).
  virtual Status propose_blocks(std::span<const DraftBlockRequest> requests, std::vector<DraftBlockResult>& results,
                                bool want_logits = false) {
    return unimplemented("this runner has no draft model");
  }
  // Makes the backend's device current on the calling thread (a lane's thread).
  virtual void bind_thread() {}
  // The second lane for long prefill chunks (runtime/prefill_lane.h), when enabled.
  virtual PrefillLane* prefill_lane() { return nullptr; }
};

struct RunnerOptions {
  int max_seqs_per_step = 16;    // the running-request cap (decode batch bound)
  int max_tokens_per_step = 2048;
  bool cuda_graphs = true;        // decode steps as captured graphs where the backend can
  int64_t fail_after_steps = -1;  // >= 0: the backend "fails" after this many steps (tests)
  // Speculative decoding: draft tokens a sequence may bring per step (0: none); sizes the
  // buffer of saved rows for state rollbacks (max_seqs_per_step * (1 + this) rows).
  int num_speculative_tokens = 0;
  // The longest context a sequence may reach (0: as many tokens as the cache holds); bounds
  // a DSpark draft's table of rope rows.
  int64_t max_positions = 0;
  // This runner's rank in a tensor-parallel group: every rank runs the forward, rank 0
  // alone samples and returns tokens (and logits when asked).
  int rank = 0;
  // DP attention over the group's ranks (SGLang --enable-dp-attention; 1: off): every rank
  // gets the whole step, runs attention for the sequences it owns (state slot mod this
  // size: a sequence's caches stay on one rank for its life) and meets the others at each
  // MoE layer; the logits rows are gathered for rank 0 to sample in the step's order.
  int dp_attention_size = 1;
  // Pipeline stages (Model::pipeline_stages() > 1): a step of several sequences runs as up to
  // this many micro-batches (0: as many as the stages; 1: none), so that while a later stage
  // works on one the earlier stages go on with the next. Eager steps only (a captured decode
  // graph is one batch), and not for steps that verify drafts or bring image rows.
  int pipeline_micro_batches = 0;
};

class ModelRunner final : public StepRunner {
 public:
  // Allocates the cache pools for `cache` (plus one slot and one page for padding decode
  // batches up to a captured size) on the ops' backend.
  static Result<std::unique_ptr<ModelRunner>> create(std::unique_ptr<Ops> ops, std::unique_ptr<Model> model,
                                                     const CacheConfig& cache, const RunnerOptions& options);
  ~ModelRunner() override;

  Status step(const StepInput& input, StepOutput& output) override;
  int vocab() const override { return model_->config().vocab_size; }

  Ops& ops() { return *ops_; }
  Model& model() { return *model_; }
  const CachePools& pools() const { return pools_; }
  RunnerStats stats() const override { return {steps_, graph_replays_, tokens_computed_, micro_batches_}; }
  int64_t free_bytes() const override { return ops_->free_bytes(); }
  Result<std::vector<float>> encode_images(std::span<const vision::ImagePatches* const> images) override;
  bool set_op_profile(OpProfile* profile) override {
    profile_ = profile;
    return true;
  }
  // Speculative decoding with a DSpark draft: allocates its page pool (the target's page
  // geometry) and the taps the target's forward fills; from then on every step writes the
  // draft's context rows of the tokens it computed.
  Status attach_draft(std::unique_ptr<DSparkDraft> draft);
  Status propose_blocks(std::span<const DraftBlockRequest> requests, std::vector<DraftBlockResult>& results,
                        bool want_logits = false) override;
  const DSparkDraft* draft() const { return draft_.get(); }
  const DraftPool& draft_pool() const { return draft_pool_; }
  void bind_thread() override { ops_->bind_thread(); }
  // A second lane for long prefill chunks (runtime/prefill_lane.h): a runner over this one's
  // model and cache pools on a lane of the backend (Ops::make_lane) with scratch for a step
  // of chunk_tokens tokens, eager (no graphs); with a DSpark draft attached (first), the
  // lane's steps ingest their context rows too. A group's ranks get theirs from
  // make_lane_runner.
  Status enable_prefill_lane(int chunk_tokens);
  // The lane's runner of this rank: comm its member of the lanes' own group (nullptr at one
  // rank). ParallelRunner::enable_prefill_lane runs one a rank behind one PrefillLane.
  Result<std::unique_ptr<ModelRunner>> make_lane_runner(int chunk_tokens, std::unique_ptr<Communicator> comm);
  PrefillLane* prefill_lane() override { return lane_.get(); }

 private:
  ModelRunner() = default;
  Status check(const StepInput& input) const;
  Status step_dp(const StepInput& input, StepOutput& output);  // RunnerOptions::dp_attention_size > 1
  // The step's sequences cut into micro-batches for pipeline stages: each group's first
  // sequence (empty or one group: the step runs whole).
  std::vector<int> micro_batch_starts(const StepInput& input, bool graph) const;
  // The positions batch_ reaches against the model's (and a DSpark draft's) tables.
  Status check_positions() const;
  // Runs the step's forward as micro-batches (Model::forward_body each, forward_head once),
  // writing logits [all rows, vocab]. Returns a position error like the whole step's.
  Status forward_micro_batches(Ops& ops, const StepInput& input, const std::vector<int>& starts, Tensor logits);
  // Samples each sampling sequence's rows of logits; order maps the step's logits rows (in
  // its sequences' order) to rows of logits (nullptr: the same rows).
  void sample_rows(Ops& ops, const StepInput& input, const Tensor& logits, const std::vector<int32_t>* order,
                   StepOutput& output);
  // padded_seqs: with padding sequences of pad_tokens tokens each up to that count (a graph).
  void build_batch(const StepInput& input, int padded_seqs, int pad_tokens);
  void run_state_copies(const std::vector<StateCopy>& copies);
  void run_replays(Ops& ops, const std::vector<StateReplay>& replays);

  std::unique_ptr<Ops> ops_;
  std::shared_ptr<Model> model_;  // a prefill lane's runner shares it
  CachePools pools_;
  CacheConfig cache_;
  RunnerOptions options_;
  int pad_slot_ = -1, pad_page_ = -1;  // what padding sequences read and write
  ForwardBatch batch_;                 // rebuilt each step (capacity kept)
  // State rollbacks (StateReplay) run in a captured graph when a step has at most this many;
  // their graphs' keys carry this bit (a step's never do).
  static constexpr int kMaxCapturedReplays = 4;
  static constexpr uint64_t kReplayGraphKey = uint64_t{1} << 63;
  ForwardBatch replay_batch_;          // the rollbacks' batch (StateReplay)
  std::vector<int32_t> replay_rows_;   // its tokens' saved rows
  int replay_capacity_rows_ = 0;       // rows pools_.replay holds
  int last_saved_rows_ = 0;            // rows the last forward saved there
  int64_t steps_ = 0;
  int64_t graph_replays_ = 0;
  int64_t micro_batches_ = 0;
  int64_t tokens_computed_ = 0;
  OpProfile* profile_ = nullptr;
  std::unique_ptr<DSparkDraft> draft_;
  // The draft whose context rows this runner's steps write: draft_, or the main runner's
  // for a prefill lane's runner (which proposes nothing).
  DSparkDraft* ingest_draft_ = nullptr;
  DraftPool draft_pool_;
  Status failed_ = Status::ok();  // sticky: the backend's state is unknown after a failure
  std::unique_ptr<PrefillLane> lane_;  // enable_prefill_lane; destroyed first
};

// The decode batch sizes captured as graphs: a decode step of n sequences runs padded to
// the smallest bucket >= n (SGLang's cuda_graph_bs).
int decode_bucket(int n_seqs, int max_seqs);

}  // namespace moonrun
