#pragma once
// Sampling on the CPU: the reference of Ops::sample (backend/sampling.h has the pipeline
// and its order, vLLM's). Each step is a function of its own so that the tests can check
// it against hand-derived distributions; the CUDA sampler is tested against sample_row.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/sampling.h"

namespace moonrun::cpu {

// One row through the whole pipeline. raw_logits: [vocab]; row's edits are in `batch`.
SampleResult sample_row(const float* raw_logits, int vocab, const SamplingRow& row, const SamplingBatch& batch);

// The pieces, in pipeline order. Masked tokens become -inf.
void apply_mask(std::vector<float>& logits, const uint32_t* allowed_bits);
void apply_biases(std::vector<float>& logits, std::span<const TokenBias> biases);
void apply_penalties(std::vector<float>& logits, const SamplingRow& row, std::span<const TokenCount> history);
void apply_temperature(std::vector<float>& logits, float temperature);
void apply_min_p(std::vector<float>& logits, float min_p);
void apply_top_k_top_p(std::vector<float>& logits, int top_k, float top_p);
// Steps 1-3 (mask, biases, penalties): what greedy takes the argmax of.
std::vector<float> edited_logits(const float* raw_logits, int vocab, const SamplingRow& row,
                                 const SamplingBatch& batch);
// The distribution step 5 draws from, for tests (non-greedy rows).
std::vector<double> sampling_distribution(const float* raw_logits, int vocab, const SamplingRow& row,
                                          const SamplingBatch& batch);

// The raw log-probability of r.token and the k most likely tokens (best first, ties by lower
// id), from the unedited logits: what a row asking for logprobs reports.
void add_logprobs(const float* raw_logits, int vocab, int k, SampleResult& r);

std::vector<double> softmax(const std::vector<float>& logits);
std::vector<float> log_softmax(const float* logits, int vocab);
int32_t argmax(const std::vector<float>& logits);

}  // namespace moonrun::cpu
