#pragma once
// Sampling on the GPU: the twin of the engine's sampler (engine/sampler.h) for the
// per-row transforms that touch the whole vocabulary. Given the same logits, parameters and
// uniform draw u, it picks the same token as the CPU sampler.
#include <cuda_runtime_api.h>

#include <cstdint>

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

// The pipeline per row, as sample_token (engine/sampler.cpp) runs it after the penalties:
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

}  // namespace moonrun::cuda
