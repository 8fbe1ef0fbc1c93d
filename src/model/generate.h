#pragma once
// Single-sequence generation on the CPU model: the prompt in one forward (chunked KDA,
// plain MLA), then one token per forward through the caches (recurrent KDA, absorbed
// MLA). What `moonrun generate` and the fixture tests run.
#include <cstdint>
#include <functional>
#include <vector>

#include "model/kimi_k3.h"

namespace moonrun {

struct GenerateOptions {
  int max_tokens = 16;
  float temperature = 0.0f;  // 0: greedy (ties: the lowest id)
  uint64_t seed = 0;
  bool keep_logits = false;
  // Teacher forcing: when set, token k+1 is fed forced_ids[k] whatever was picked (the
  // picks are still returned), so logits stay aligned with a reference's sequence.
  std::vector<int32_t> forced_ids;
};

struct GenerateResult {
  std::vector<int32_t> token_ids;  // [n_generated]
  // [n_generated, vocab] when keep_logits: row k is what token k was chosen from
  // (row 0 = the last prompt position).
  std::vector<float> logits;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // the forwards after the prompt's
};

Result<GenerateResult> generate(const KimiK3Model& model, const std::vector<int32_t>& prompt,
                                const GenerateOptions& opt);

// The same loop over any backend: `forward` runs one ForwardBatch of one sequence (KDA slot
// 0, MLA pages 0, 1, ... of page_size_tokens each, enough for prompt + max_tokens) and
// writes its logits row.
using ForwardFn = std::function<Status(const ForwardBatch& batch, float* logits)>;
Result<GenerateResult> generate_with(const ForwardFn& forward, int vocab, int page_size_tokens,
                                     const std::vector<int32_t>& prompt, const GenerateOptions& opt);
// Pages generate_with needs for this prompt and options.
int generate_pages_needed(size_t prompt_tokens, const GenerateOptions& opt, int page_size_tokens);

// Picks a token from one row of logits: argmax at temperature 0, else a sample of
// softmax(logits / temperature) drawn with `rng_state` (splitmix64, advanced in place).
int32_t sample_token(const float* logits, int vocab, float temperature, uint64_t& rng_state);

}  // namespace moonrun
