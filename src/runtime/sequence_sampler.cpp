#include "runtime/sequence_sampler.h"

#include <algorithm>
#include <limits>

namespace moonrun {

SequenceSampler::SequenceSampler(const SamplingParams& params, uint64_t seed, std::span<const int32_t> prompt)
    : params_(params), rng_(seed) {
  if (params_.repetition_penalty != 1.0f) {
    prompt_tokens_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
    prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()), prompt_tokens_.end());
  }
}

void SequenceSampler::add_row(SamplingBatch& batch, int num_output_tokens, std::span<const int32_t> banned,
                              std::span<const uint32_t> allowed_bits) {
  SamplingRow row;
  row.temperature = params_.temperature;
  row.top_k = params_.top_k;
  row.top_p = params_.top_p;
  row.min_p = params_.min_p;
  row.repetition_penalty = params_.repetition_penalty;
  row.frequency_penalty = params_.frequency_penalty;
  row.presence_penalty = params_.presence_penalty;
  row.logprobs = params_.logprobs;
  if (!row.greedy()) row.u = rng_.uniform();

  row.history_begin = static_cast<int32_t>(batch.history.size());
  if (row.has_penalties()) {
    // Every token seen once, with its count in the output (0: prompt only).
    for (const auto& [token, count] : output_counts_) batch.history.push_back({token, count});
    for (int32_t t : prompt_tokens_)
      if (!output_counts_.count(t)) batch.history.push_back({t, 0});
  }
  row.history_end = static_cast<int32_t>(batch.history.size());

  row.bias_begin = static_cast<int32_t>(batch.biases.size());
  for (const auto& [token, bias] : params_.logit_bias) batch.biases.push_back({token, bias});
  if (num_output_tokens < params_.min_tokens)
    for (int32_t t : banned) batch.biases.push_back({t, -std::numeric_limits<float>::infinity()});
  row.bias_end = static_cast<int32_t>(batch.biases.size());

  if (!allowed_bits.empty()) {
    if (batch.mask_words == 0) batch.mask_words = static_cast<int>(allowed_bits.size());
    row.mask_row = static_cast<int32_t>(batch.allowed.size() / batch.mask_words);
    batch.allowed.insert(batch.allowed.end(), allowed_bits.begin(), allowed_bits.end());
  }
  batch.rows.push_back(row);
}

void SequenceSampler::accept(int32_t token) {
  if (params_.has_penalties()) ++output_counts_[token];
}

void SequenceSampler::unaccept(int32_t token) {
  if (!params_.has_penalties()) return;
  auto it = output_counts_.find(token);
  if (it != output_counts_.end() && --it->second <= 0) output_counts_.erase(it);
}

}  // namespace moonrun
