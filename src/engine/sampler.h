#pragma once
// Picks the next token of one sequence from its logits row. The order of operations is
// vLLM's (v1/sample/sampler.py), so that the same SamplingParams mean the same thing here:
//   1. logprobs, when asked, come from the raw logits (log_softmax before any processing;
//      vLLM's default logprobs_mode "raw_logprobs");
//   2. penalties: repetition (prompt + output tokens; logit > 0 divided, else multiplied),
//      then frequency (minus count in the output), then presence (minus 1 if in the output);
//   3. temperature < 1e-5: greedy, the argmax of the penalised logits (first index on ties);
//   4. otherwise: divide by temperature, min_p, then top-k, then top-p, and draw from the
//      softmax of what is left with the request's own generator.
// Each step is a function of its own so that the tests can check it against hand-derived
// distributions.
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace moonrun {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;            // raw log-probability of token
  std::vector<TokenLogprob> top;   // the params.logprobs most likely tokens, best first
};

// A request's random stream: seeded from params.seed (deterministic) or from the engine's
// seed sequence. 53 random bits per draw.
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed = 0) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  std::mt19937_64 gen_;
};

// The pipeline on one row. raw_logits: [vocab]. prompt/output: the token ids so far.
SampleResult sample_token(const float* raw_logits, int vocab, const SamplingParams& params,
                          std::span<const int32_t> prompt, std::span<const int32_t> output,
                          SamplerRng& rng);

// The pieces, in pipeline order. Masked tokens become -inf.
void apply_penalties(std::vector<float>& logits, const SamplingParams& params,
                     std::span<const int32_t> prompt, std::span<const int32_t> output);
void apply_temperature(std::vector<float>& logits, float temperature);
void apply_min_p(std::vector<float>& logits, float min_p);
void apply_top_k_top_p(std::vector<float>& logits, int top_k, float top_p);
// The distribution step 4 draws from (after temperature, min_p, top-k, top-p), for tests.
std::vector<double> sampling_distribution(const float* raw_logits, int vocab,
                                          const SamplingParams& params,
                                          std::span<const int32_t> prompt,
                                          std::span<const int32_t> output);

std::vector<double> softmax(const std::vector<float>& logits);
std::vector<float> log_softmax(const float* logits, int vocab);
int32_t argmax(const std::vector<float>& logits);

}  // namespace moonrun
