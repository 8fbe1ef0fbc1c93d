#pragma once
// One sequence's sampling state on the host: its parameters, its own random stream, and
// the token counts the penalties need. Each step it contributes one row to the step's
// SamplingBatch (backend/sampling.h); the backend that ran the model picks the token. The
// same rows, seeds and draws are made by `moonrun generate` and by the server's engine, so a
// seed gives the same tokens in both.
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/sampling.h"
#include "runtime/sampling_params.h"

namespace moonrun {

// A sequence's random stream: seeded from params.seed (deterministic) or from the engine's
// seed sequence. 53 random bits per draw, one draw per non-greedy token.
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed = 0) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  std::mt19937_64 gen_;
};

class SequenceSampler {
 public:
  SequenceSampler() = default;
  // seed: the stream's seed (vLLM: a seeded request's sample i uses seed + i).
  SequenceSampler(const SamplingParams& params, uint64_t seed, std::span<const int32_t> prompt);

  // Appends the row for this sequence's next token. `banned`: tokens that may not come yet
  // (EOS and stop tokens before min_tokens); `allowed_bits`: a structured-output mask
  // (ceil(vocab / 32) words) or empty.
  void add_row(SamplingBatch& batch, int num_output_tokens, std::span<const int32_t> banned,
               std::span<const uint32_t> allowed_bits = {});
  // The token picked from that row: counted for the penalties.
  void accept(int32_t token);
  // Takes back an accept() (speculative decoding counts each draft while it adds the rows
  // that follow it, then takes the drafts back: the verdict decides what is accepted).
  void unaccept(int32_t token);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  SamplerRng rng_;
  std::vector<int32_t> prompt_tokens_;              // distinct, sorted (repetition penalty only)
  std::unordered_map<int32_t, int32_t> output_counts_;
};

}  // namespace moonrun
