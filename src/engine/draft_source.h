#pragma once
// Speculative decoding's draft sources: what guesses the tokens a step verifies. Before each
// step the engine asks one for the drafts of every sequence that is decoding; the runner
// verifies them in the step's flat batch (runtime/model_runner.h, StepSeq::n_draft) and the
// engine keeps the prefix the model agrees with. A source sees only the sequence's tokens,
// so the engine, scheduler and runner never learn which one runs.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace moonrun {

// kDSpark: a DSpark draft model beside the target (model/dspark_draft.h); the runner runs it,
// so make_draft_source has no source for it and the engine asks the runner for its blocks.
enum class SpecMethod { kNone, kNgram, kSuffix, kDSpark };
const char* spec_method_name(SpecMethod method);  // "none", "ngram", "suffix", "dspark"

// vLLM's --speculative-config fields (and SGLang's flags, cli/serve_flags.cpp).
struct SpeculativeConfig {
  SpecMethod method = SpecMethod::kNone;
  int num_speculative_tokens = 0;  // k: drafts a sequence brings to a step, at most
  // n-gram lookup: the longest suffix of the sequence, between these lengths, that occurred
  // before proposes the tokens that followed it (vLLM's prompt_lookup_min / _max).
  int prompt_lookup_min = 2;
  int prompt_lookup_max = 5;
  // No drafts while this many sequences or more are decoding: a large batch is no longer
  // bound by the weight reads that speculation shares (vLLM's disable_by_batch_size). 0: the
  // engine decides from its measured steps where it can (EngineConfig::auto_stand_aside),
  // else never.
  int disable_by_batch_size = 0;
  // Suffix decoding (engine/suffix_draft_source.h), vLLM's suffix_decoding_* fields and defaults:
  // the trees' depth bounds match + draft; earlier answers kept (0: only the request's own
  // tokens); drafts at most max_spec_factor x the match length; tokens below min_token_prob
  // (estimated from counts) end the draft. A factor of 2 took 15 % fewer verify steps on the
  // seed's prompts but was no faster alone and 0.80x over 32 streams on an H100 (longer verify
  // steps, more rejected rows: docs/performance.md, 2026-12-07 night), so vLLM's 1 stays.
  int suffix_max_tree_depth = 24;
  int suffix_max_cached_requests = 10000;
  double suffix_max_spec_factor = 1.0;
  double suffix_min_token_prob = 0.1;
  // DSpark: the draft checkpoint (a directory or a hub repo id; vLLM's "model", SGLang's
  // --speculative-draft-model-path), and the confidence below which a block's drafts stop
  // (0: every slot is proposed).
  std::string draft_model;
  double dspark_confidence_threshold = 0.0;
  bool enabled() const { return method != SpecMethod::kNone && num_speculative_tokens > 0; }
};

// One-line errors for impossible settings (k < 0, min > max, ...).
Status check_speculative_config(const SpeculativeConfig& config);

// One sequence as a draft source sees it: the engine's sequence id (unique while it lives) and
// its tokens so far. The output only grows while the id lives.
struct DraftRequest {
  int64_t seq_id = 0;
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // Appends up to max_tokens drafts to follow the sequence prompt + output (none is fine).
  virtual void propose(const DraftRequest& request, int max_tokens, std::vector<int32_t>& drafts) = 0;
  // The sequence ended (finished, aborted, failed): what a source keeps of it is its own choice.
  virtual void release(const DraftRequest& request) { (void)request; }
};

// Prompt lookup (vLLM's "ngram", SGLang's NGRAM): the most recent earlier occurrence of the
// longest matching suffix n-gram, and the tokens after it. Costs one backward scan over the
// sequence (bounded by kMaxLookbackTokens) per step.
class NgramDraftSource final : public DraftSource {
 public:
  static constexpr int kMaxLookbackTokens = 1 << 18;
  NgramDraftSource(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {}
  void propose(const DraftRequest& request, int max_tokens, std::vector<int32_t>& drafts) override;

 private:
  int min_n_, max_n_;
};

// The source `config` names; nullptr when speculation is off.
std::unique_ptr<DraftSource> make_draft_source(const SpeculativeConfig& config);

}  // namespace moonrun
