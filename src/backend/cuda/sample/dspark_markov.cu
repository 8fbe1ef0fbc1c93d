// DSpark's Markov and confidence heads on the device (Ops::dspark_markov; the CPU twin is
// CpuOps::dspark_markov). A draft block's slots are sequential - slot k's bias is w2 · w1[the
// token slot k-1 chose] - so one thread block walks one draft block's slots: per slot every
// thread adds the bias to its share of the vocabulary and keeps its best (value, id), the
// block folds them to the argmax, and thread 0 hands the token to the next slot. Before this
// the draft downloaded every block logit and ran the head on one host core: 1.3 M
// multiply-adds a step for the demo draft, as long as the verify step itself.
//
// A row's dot product over the rank is a warp's tree sum (the CPU's loop runs in order: the
// biases agree to float rounding); the argmax is the lowest id among equal maxima
// (argmax.cu's order). One thread block per draft block
// is enough for the demo draft (V 2560); a K3-vocabulary draft (V 163840) would want the
// vocabulary split over several blocks per slot (left for when one is measured).
#include <cfloat>
#include <climits>
#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/dense/block_reduce.cuh"
#include "backend/cuda/sample/sample_ops.h"

namespace moonrun::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kMaxRank = 1024;

struct Best {
  float v;
  int i;
};

__device__ __forceinline__ void take(Best& b, float v, int i) {
  if (v > b.v || (v == b.v && i < b.i)) b = Best{v, i};
}

__global__ void __launch_bounds__(kThreads)
    dspark_markov_kernel(float* __restrict__ logits, int vocab, const float* __restrict__ w1,
                         const float* __restrict__ w2, int rank, const int32_t* __restrict__ ids, int block,
                         int n_slots, const float* __restrict__ h, int hidden, const float* __restrict__ conf_w,
                         int conf_cols, float conf_b, int32_t* __restrict__ tokens, float* __restrict__ conf) {
  __shared__ float e[kMaxRank];
  __shared__ float best_v[kThreads / 32];
  __shared__ int best_i[kThreads / 32];
  __shared__ double sums[32];
  __shared__ int prev;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * block;
  if (threadIdx.x == 0) prev = ids[first_row];
  __syncthreads();
  for (int k = 0; k < n_slots; ++k) {
    const int64_t row_id = first_row + k;
    const float* we = w1 + static_cast<int64_t>(prev) * rank;
    for (int c = threadIdx.x; c < rank; c += blockDim.x) e[c] = we[c];
    __syncthreads();
    float* row = logits + row_id * vocab;
    Best best{-FLT_MAX, INT_MAX};
    bool any = false;
    // A warp per vocabulary row, its lanes over the rank: w2's rows are read whole and in
    // order (a thread per row read them 4 * rank bytes apart, 32 lines a load, ~100 us a
    // slot on the demo draft). Lane 0 holds the row's sum.
    const int n_warps = static_cast<int>(blockDim.x >> 5);
    for (int v = warp; v < vocab; v += n_warps) {
      const float* w = w2 + static_cast<int64_t>(v) * rank;
      float dot = 0.0f;
      for (int c = lane; c < rank; c += 32) dot += w[c] * e[c];
      for (int offset = 16; offset > 0; offset >>= 1) dot += __shfl_xor_sync(kFullWarp, dot, offset);
      if (lane == 0) {
        const float x = row[v] + dot;
        row[v] = x;
        if (!(x != x) && (!any || x > best.v || (x == best.v && v < best.i))) {  // NaN never wins
          best = Best{x, v};
          any = true;
        }
      }
    }
    if (!any) best = Best{-FLT_MAX, INT_MAX};
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float v = __shfl_xor_sync(kFullWarp, best.v, offset);
      const int i = __shfl_xor_sync(kFullWarp, best.i, offset);
      take(best, v, i);
    }
    if (lane == 0) {
      best_v[warp] = best.v;
      best_i[warp] = best.i;
    }
    // The confidence head: a block sum (double, as the CPU's) over this row's normed state
    // and, with the Markov features, e.
    double z = 0.0;
    if (conf_w != nullptr) {
      const float* hk = h + row_id * hidden;
      for (int c = threadIdx.x; c < hidden; c += blockDim.x) z += static_cast<double>(conf_w[c] * hk[c]);
      if (conf_cols > hidden)
        for (int c = threadIdx.x; c < rank; c += blockDim.x) z += static_cast<double>(conf_w[hidden + c] * e[c]);
      z = block_sum(z, sums);  // its __syncthreads also publishes best_v / best_i
    } else {
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      Best all{best_v[0], best_i[0]};
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) take(all, best_v[w], best_i[w]);
      const int token = all.i == INT_MAX ? 0 : all.i;  // no non-NaN value: 0, as the CPU's
      tokens[row_id] = token;
      if (conf_w != nullptr) conf[row_id] = static_cast<float>(1.0 / (1.0 + exp(-(static_cast<double>(conf_b) + z))));
      prev = token;
    }
    __syncthreads();
  }
}

}  // namespace

void dspark_markov(float* logits, int n_blocks, int vocab, const float* w1, const float* w2, int rank,
                   const int32_t* ids, int block, int n_slots, const float* h, int hidden, const float* conf_w,
                   int conf_cols, float conf_b, int32_t* tokens, float* conf, cudaStream_t stream) {
  if (n_blocks == 0 || n_slots == 0) return;
  dspark_markov_kernel<<<n_blocks, kThreads, 0, stream>>>(logits, vocab, w1, w2, rank, ids, block, n_slots, h, hidden,
                                                          conf_w, conf_cols, conf_b, tokens, conf);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
