// The per-row logit edits before sampling, the twin of cpu::edited_logits
// (backend/cpu/sample.cpp): the structured-output mask, the logit biases (and the -inf bans
// of min_tokens), then repetition, frequency and presence penalties over the row's history.
// One block per row. The history lists each token once, so its entries are independent and
// edited in parallel; biases may name a token twice (a logit_bias entry and a ban), so one
// thread applies them in list order, as the CPU does.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/sample/sample_ops.h"

namespace moonrun::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void logit_edits_kernel(float* logits, int vocab, const DeviceRowEdits* __restrict__ rows,
                                   const TokenCount* __restrict__ history, const TokenBias* __restrict__ biases,
                                   const uint32_t* __restrict__ masks, int mask_words) {
  const DeviceRowEdits e = rows[blockIdx.x];
  float* l = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  if (e.mask_row >= 0) {
    const uint32_t* bits = masks + static_cast<int64_t>(e.mask_row) * mask_words;
    for (int t = threadIdx.x; t < vocab; t += blockDim.x)
      if (!((bits[t / 32] >> (t % 32)) & 1u)) l[t] = -INFINITY;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int j = e.bias_begin; j < e.bias_end; ++j) {
      const TokenBias b = biases[j];
      if (b.token >= 0 && b.token < vocab) l[b.token] += b.bias;
    }
  __syncthreads();
  for (int j = e.history_begin + threadIdx.x; j < e.history_end; j += blockDim.x) {
    const TokenCount h = history[j];
    if (h.token < 0 || h.token >= vocab) continue;
    float x = l[h.token];
    if (e.repetition_penalty != 1.0f) x = x > 0 ? x / e.repetition_penalty : x * e.repetition_penalty;
    if (h.output_count > 0) {
      x -= e.frequency_penalty * static_cast<float>(h.output_count);
      x -= e.presence_penalty;
    }
    l[h.token] = x;
  }
}

}  // namespace

void apply_logit_edits(float* logits, int n_rows, int vocab, const DeviceRowEdits* rows, const TokenCount* history,
                       const TokenBias* biases, const uint32_t* masks, int mask_words, cudaStream_t stream) {
  if (n_rows <= 0) return;
  logit_edits_kernel<<<n_rows, kThreads, 0, stream>>>(logits, vocab, rows, history, biases, masks, mask_words);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
