#pragma once
// Sampling on the GPU: the twin of the CPU sampler (backend/cpu/sample.h) for the
// per-row transforms that touch the whole vocabulary. Given the same logits, parameters and
// uniform draw u, it picks the same token as the CPU sampler.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/sampling.h"

namespace moonrun::cuda {

struct DeviceSamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  // The request's uniform draw in [0, 1): SamplerRng::uniform(), all 53 bits of it. A double,
  // not a float: the CPU sampler compares it against double cumulative probabilities, and a
  // float u would move the draw by up to 2^-25 and pick a different token near a boundary.
  double u = 0.0;
};

// The pipeline per row, as cpu::sample_row (backend/cpu/sample.cpp) runs it after the edits:
//   temperature < 1e-5: argmax, the lowest id on ties;
//   else x = logit / temperature; min_p; top-k (ties at the k-th value all stay); top-p (in
//   order of probability, ties by lower id, keep until the mass above a token reaches top_p);
//   then the inverse CDF in token-id order: the first id whose cumulative probability
//   exceeds u (the last id with mass when rounding leaves u above the total).
// Probabilities are computed in double like the CPU's; only summation order differs, so
// the ids agree except when u or top_p sits within ~1e-15 of a boundary.
// logits [n_rows, vocab] fp32 (device); params [n_rows] (device); out_ids [n_rows] (device).
void sample_rows(const float* logits, int n_rows, int vocab, const DeviceSamplingParams* params, int32_t* out_ids,
                 cudaStream_t stream);

// Greedy batches (every row's temperature < 1e-5, as sample_rows tells greedy rows): the
// same ids as sample_rows, the argmax of each row with the lowest id on ties, from a
// many-block pass over the row and a one-warp fold per row (argmax.cu). Needs no parameters.
// partials: device scratch of argmax_partials(n_rows, vocab) entries; logits [n_rows, vocab]
// fp32 (device); out_ids [n_rows] (device). Two launches, no allocation, no synchronisation.
struct ArgmaxPartial {
  float value;
  int32_t index;
};
int argmax_partials(int n_rows, int vocab);
void argmax_rows(const float* logits, int n_rows, int vocab, ArgmaxPartial* partials, int32_t* out_ids,
                 cudaStream_t stream);

}  // namespace moonrun::cuda

namespace moonrun::cuda {

// The sparse edits of one row before sampling (backend/sampling.h's steps 1-3).
struct DeviceRowEdits {
  int32_t history_begin = 0, history_end = 0;  // into `history`
  int32_t bias_begin = 0, bias_end = 0;        // into `biases`
  int32_t mask_row = -1;                       // row of `masks`, -1: none
  float repetition_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
};

// In place over logits [n_rows, vocab]: the allowed-token mask (disallowed -> -inf), the
// biases, then the penalties over each row's history, as cpu::edited_logits does them.
void apply_logit_edits(float* logits, int n_rows, int vocab, const DeviceRowEdits* rows, const TokenCount* history,
                       const TokenBias* biases, const uint32_t* masks, int mask_words, cudaStream_t stream);

// DSpark's Markov and confidence heads (Ops::dspark_markov, dspark_markov.cu): per slot, a
// pass over the vocabulary on many thread blocks, then a pick per draft block. conf_w may be
// null (no confidence head); conf_cols is H or H + rank. scratch: device memory of
// dspark_markov_scratch_bytes(n_blocks, vocab). Every pointer is device memory; no
// synchronisation.
int64_t dspark_markov_scratch_bytes(int n_blocks, int vocab);
void dspark_markov(float* logits, int n_blocks, int vocab, const float* w1, const float* w2, int rank,
                   const int32_t* ids, int block, int n_slots, const float* h, int hidden, const float* conf_w,
                   int conf_cols, float conf_b, int32_t* tokens, float* conf, void* scratch, cudaStream_t stream);

}  // namespace moonrun::cuda
