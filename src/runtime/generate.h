#pragma once
// One sequence through a runner: the prompt as one prefill (or in chunks), then one token
// per step. What
// `moonrun generate` and the fixture tests run. It samples through the same path as the
// server's engine (SequenceSampler rows, the backend's sampler), seeded the same way, so a
// seed gives the same tokens from `generate` and from `serve`.
#include <cstdint>
#include <vector>

#include "runtime/model_runner.h"
#include "runtime/sampling_params.h"

namespace moonrun {

struct GenerateOptions {
  // temperature (default 0: greedy), top_p, top_k, min_p, penalties, seed; max_tokens is below.
  SamplingParams sampling{.temperature = 0.0f};
  int max_tokens = 16;
  bool keep_logits = false;
  // The prompt goes through the runner in chunks of this many tokens, as the server's
  // chunked prefill feeds it (0: one step). Only the last chunk samples.
  int prefill_chunk_tokens = 0;
  // Teacher forcing: when set, token k+1 is fed forced_ids[k] whatever was picked (the
  // picks are still returned), so logits stay aligned with a reference's sequence.
  std::vector<int32_t> forced_ids;
  // Image rows for the prompt (StepRunner::encode_images): prompt position given_at[i]
  // takes row i of given_rows instead of its embedding.
  std::vector<int32_t> given_at;
  std::vector<float> given_rows;
};

struct GenerateResult {
  std::vector<int32_t> token_ids;  // [n_generated]
  // [n_generated, vocab] when keep_logits: row k is what token k was chosen from
  // (row 0 = the last prompt position).
  std::vector<float> logits;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // the steps after the prompt's
};

// Runs on state slot 0 and KV pages 0, 1, ... (the runner's cache must hold
// pages_for_generate() pages of page_size_tokens).
Result<GenerateResult> generate(StepRunner& runner, int page_size_tokens, const std::vector<int32_t>& prompt,
                                const GenerateOptions& opt);
int pages_for_generate(size_t prompt_tokens, const GenerateOptions& opt, int page_size_tokens);

}  // namespace moonrun
