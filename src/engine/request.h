#pragma once
// One sequence being generated. In vLLM's model there are no prefill and decode phases: a
// request has num_tokens() known tokens (prompt + generated) of which num_computed_tokens
// are in the caches; each step computes some of the rest (a prefill chunk, or the one token
// sampled last step) and, when that reaches the end, samples one more token.
// A preempted request loses its caches and starts over at num_computed_tokens = 0 with its
// generated tokens kept: recomputing them is the same as if they had been in the prompt.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "engine/output_text.h"
#include "model/vision/placeholders.h"
#include "runtime/sampling_params.h"
#include "runtime/sequence_sampler.h"
#include "runtime/token_constraint.h"

namespace moonrun {

enum class RequestState { kWaiting, kRunning, kFinished };

enum class FinishReason {
  kNone,    // still running
  kStop,    // eos, a stop token or a stop string
  kLength,  // max_tokens or the context length
  kAbort,   // the client went away or asked to abort
  kError,   // the engine failed
};
// OpenAI's spelling: "stop", "length", "abort", "error" ("" while running).
const char* finish_reason_name(FinishReason reason);

struct Request {
  int64_t seq_id = 0;     // unique per sequence; the cache manager's key
  uint64_t group_id = 0;  // the client's request (n sequences share it)
  int index = 0;          // which of the n samples

  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  SamplingParams params;
  int max_output_tokens = 0;  // params.max_tokens, or what the context leaves

  RequestState state = RequestState::kWaiting;
  int num_computed_tokens = 0;
  int num_cached_tokens = 0;  // prompt tokens the prefix cache served at admission
  int num_preemptions = 0;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;  // the stop string that matched, if any
  // When a step first computed any of its tokens: the end of its queue time (metrics).
  std::chrono::steady_clock::time_point first_scheduled_time{};

  // Speculative decoding: the draft tokens proposed for the next step (they follow the last
  // known token, which is not computed yet), and the rollback the next step must run
  // because this one rejected some of them (StateReplay; n_tokens 0: none).
  std::vector<int32_t> draft_ids;
  struct PendingReplay {
    int first_row = 0;
    int n_tokens = 0;
  } pending_replay;
  int num_spec_steps = 0;            // steps that verified drafts
  int num_draft_tokens = 0;          // drafts verified
  int num_accepted_draft_tokens = 0; // of which accepted
  // A prefill chunk of it runs on the prefill lane (runtime/prefill_lane.h) now: the
  // scheduler leaves it alone (no step, no preemption) until the engine collects the chunk.
  bool in_lane = false;

  SequenceSampler sampler;
  OutputText text;
  std::unique_ptr<TokenConstraint> constraint;  // params.make_constraint(), or none

  // Images: the prompt positions of the expanded placeholder run and the vision tower's
  // rows for them ([positions, hidden] F32, shared by the n samples). Such a prompt is not
  // prefix-cached: its token ids do not say which image it held.
  std::vector<int32_t> image_positions;
  std::shared_ptr<const std::vector<float>> image_rows;
  bool has_images() const { return !image_positions.empty(); }

  int num_prompt_tokens() const { return static_cast<int>(prompt_ids.size()); }
  int num_output_tokens() const { return static_cast<int>(output_ids.size()); }
  int num_tokens() const { return num_prompt_tokens() + num_output_tokens(); }
  int32_t token_at(int i) const {
    MR_CHECK(i >= 0 && i < num_tokens()) << "token " << i << " of " << num_tokens();
    return i < num_prompt_tokens() ? prompt_ids[i] : output_ids[i - num_prompt_tokens()];
  }
  bool finished() const { return state == RequestState::kFinished; }
};

}  // namespace moonrun
