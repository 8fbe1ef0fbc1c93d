#pragma once
// What Ops::sample takes: one rule per logits row, with the row's sparse edits (tokens
// seen so far for the penalties, logit biases, an allowed-token mask) flattened into shared
// arrays, so a backend uploads one batch of small tables instead of per-row objects.
//
// The pipeline per row, in vLLM's order (v1/sample/sampler.py and its logits processors):
//   0. logprobs, when asked, from the raw logits (log_softmax before any processing);
//   1. the allowed-token mask (structured output): disallowed tokens -> -inf;
//   2. logit biases (logit_bias; -inf entries ban a token, e.g. EOS before min_tokens);
//   3. penalties over `history`: repetition (every token seen in prompt or output: logit > 0
//      divided by r, else multiplied), then frequency (minus f * output count), then
//      presence (minus p when the output count is > 0);
//   4. temperature < 1e-5: greedy, the argmax (the lowest id on ties);
//   5. otherwise: divide by temperature, min_p, top-k (ties at the k-th value all stay),
//      top-p (keep the best tokens until their mass first reaches top_p; ties by lower id),
//      then the inverse CDF in token-id order at the row's uniform draw u.
// Probabilities are computed in double: top-p and the draw compare cumulative sums, and
// float sums drift enough to flip a token sitting on a boundary.
#include <cstdint>
#include <vector>

namespace moonrun {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;           // raw log-probability of token (when logprobs were asked)
  std::vector<TokenLogprob> top;  // the row's `logprobs` most likely tokens, best first
};

struct TokenCount {
  int32_t token = 0;
  int32_t output_count = 0;  // 0 for a token seen only in the prompt
};

struct TokenBias {
  int32_t token = 0;
  float bias = 0.0f;  // added to the logit; -inf bans the token
};

struct SamplingRow {
  float temperature = 0.0f;  // < 1e-5: greedy
  int top_k = 0;             // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  double u = 0.0;    // the uniform draw in [0, 1) (non-greedy rows; 53 random bits)
  int logprobs = -1;  // -1: none; k >= 0: the chosen token's and the top k
  // This row's entries of SamplingBatch::history and ::biases, [begin, end).
  int32_t history_begin = 0, history_end = 0;
  int32_t bias_begin = 0, bias_end = 0;
  int32_t mask_row = -1;  // row of SamplingBatch::allowed, -1: every token allowed

  bool greedy() const { return temperature < 1e-5f; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
};

struct SamplingBatch {
  std::vector<SamplingRow> rows;
  std::vector<TokenCount> history;
  std::vector<TokenBias> biases;
  int mask_words = 0;              // ceil(vocab / 32)
  std::vector<uint32_t> allowed;   // [n_masks, mask_words]: bit t of row m = token t allowed
};

}  // namespace moonrun
