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
  float u = 0.0f;            // uniform draw in [0, 1) from the request's generator
};

// logits [n_rows, vocab] fp32 (device); params [n_rows] (device); out_ids [n_rows] (device).
void sample_rows(const float* logits, int n_rows, int vocab, const DeviceSamplingParams* params, int32_t* out_ids,
                 cudaStream_t stream);

}  // namespace moonrun::cuda
