// DSpark's Markov and confidence heads on the device (Ops::dspark_markov; the CPU twin is
// CpuOps::dspark_markov). A draft block's slots are sequential - slot k's bias is w2 · w1[the
// token slot k-1 chose] - so each slot is two launches: a pass over the vocabulary spread
// over many thread blocks (each adds the bias to its rows and keeps its best (value, id)),
// then one thread block per draft block folds those to the argmax, runs the confidence head
// and hands the token to the next slot's pass. Before, one thread block walked a draft
// block's slots alone: a single SM, latency-bound on w2's rows, ~100 us a slot on the H200
// for the demo draft (V 2560, rank 64) - as long as the verify step at k = 7.
//
// A row's dot product over the rank is a warp's tree sum (the CPU's loop runs in order: the
// biases agree to float rounding); the argmax is the lowest id among equal maxima
// (argmax.cu's order); a NaN never wins, and a row of NaNs picks 0, as on the CPU.
#include <cfloat>
#include <climits>
#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/dense/block_reduce.cuh"
#include "backend/cuda/sample/sample_ops.h"

namespace moonrun::cuda {
namespace {

constexpr int kThreads = 512;      // the pick: one block per draft block
constexpr int kRowThreads = 256;   // the pass over the vocabulary
constexpr int kRowsPerBlock = 64;  // 8 warps x 8 rows
constexpr int kMaxRank = 1024;

struct Best {
  float v;
  int i;
};

// `cand` (a value and its id) against the best so far: larger wins, then the lower id; a NaN
// never wins. Starting from {-inf, INT_MAX}, the first non-NaN value always wins.
__device__ __forceinline__ void take(Best& b, float v, int i) {
  if (!(v != v) && (v > b.v || (v == b.v && i < b.i))) b = Best{v, i};
}

__device__ __forceinline__ int slot_prev(const int32_t* ids, const int32_t* tokens, int64_t first_row, int k) {
  return k == 0 ? ids[first_row] : tokens[first_row + k - 1];
}

// Slot k's bias on rows [blockIdx.x * kRowsPerBlock, +kRowsPerBlock) of draft block
// blockIdx.y: row += w2 · w1[prev], and this thread block's best (value, id) to part.
__global__ void __launch_bounds__(kRowThreads)
    markov_rows_kernel(float* __restrict__ logits, int vocab, const float* __restrict__ w1,
                       const float* __restrict__ w2, int rank, const int32_t* __restrict__ ids, int block, int k,
                       const int32_t* __restrict__ tokens, Best* __restrict__ part) {
  __shared__ float e[kMaxRank];
  __shared__ Best best_w[kRowThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * block;
  const int prev = slot_prev(ids, tokens, first_row, k);
  const float* we = w1 + static_cast<int64_t>(prev) * rank;
  for (int c = threadIdx.x; c < rank; c += blockDim.x) e[c] = we[c];
  __syncthreads();
  float* row = logits + (first_row + k) * vocab;
  Best best{-INFINITY, INT_MAX};
  // A warp per row, its lanes over the rank (w2's rows read whole and in order); a warp's
  // rows interleaved with the other warps', their loads issued together.
  constexpr int kRowsPerWarp = kRowsPerBlock / (kRowThreads / 32);
  const int v0 = blockIdx.x * kRowsPerBlock + warp;
  float dot[kRowsPerWarp];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int v = v0 + j * (kRowThreads / 32);
    dot[j] = 0.0f;
    if (v < vocab) {
      const float* w = w2 + static_cast<int64_t>(v) * rank;
      for (int c = lane; c < rank; c += 32) dot[j] += w[c] * e[c];
    }
  }
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    for (int offset = 16; offset > 0; offset >>= 1) dot[j] += __shfl_xor_sync(kFullWarp, dot[j], offset);
    const int v = v0 + j * (kRowThreads / 32);
    if (lane == 0 && v < vocab) {
      const float x = row[v] + dot[j];
      row[v] = x;
      take(best, x, v);
    }
  }
  if (lane == 0) best_w[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    Best all = best_w[0];
    for (int w = 1; w < kRowThreads / 32; ++w) take(all, best_w[w].v, best_w[w].i);
    part[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = all;
  }
}

// Slot k of draft block blockIdx.x: the argmax over the row blocks' bests, and the
// confidence head (a block sum in double, as the CPU's, over the row's normed state and,
// with the Markov features, w1[prev]).
__global__ void __launch_bounds__(kThreads)
    markov_pick_kernel(const Best* __restrict__ part, int n_parts, const float* __restrict__ w1, int rank,
                       const int32_t* __restrict__ ids, int block, int k, const float* __restrict__ h, int hidden,
                       const float* __restrict__ conf_w, int conf_cols, float conf_b, int32_t* __restrict__ tokens,
                       float* __restrict__ conf) {
  __shared__ Best best_w[kThreads / 32];
  __shared__ double sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * block, row_id = first_row + k;
  Best best{-INFINITY, INT_MAX};
  for (int p = threadIdx.x; p < n_parts; p += blockDim.x) {
    const Best b = part[static_cast<int64_t>(blockIdx.x) * n_parts + p];
    take(best, b.v, b.i);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(kFullWarp, best.v, offset);
    const int i = __shfl_xor_sync(kFullWarp, best.i, offset);
    take(best, v, i);
  }
  if (lane == 0) best_w[warp] = best;
  double z = 0.0;
  if (conf_w != nullptr) {
    const float* e = w1 + static_cast<int64_t>(slot_prev(ids, tokens, first_row, k)) * rank;
    const float* hk = h + row_id * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) z += static_cast<double>(conf_w[c] * hk[c]);
    if (conf_cols > hidden)
      for (int c = threadIdx.x; c < rank; c += blockDim.x) z += static_cast<double>(conf_w[hidden + c] * e[c]);
    z = block_sum(z, sums);  // its __syncthreads also publishes best_w
  } else {
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    Best all = best_w[0];
    for (int w = 1; w < kThreads / 32; ++w) take(all, best_w[w].v, best_w[w].i);
    tokens[row_id] = all.i == INT_MAX ? 0 : all.i;  // no non-NaN value: 0, as the CPU's
    if (conf_w != nullptr) conf[row_id] = static_cast<float>(1.0 / (1.0 + exp(-(static_cast<double>(conf_b) + z))));
  }
}

}  // namespace

int64_t dspark_markov_scratch_bytes(int n_blocks, int vocab) {
  return static_cast<int64_t>(n_blocks) * ((vocab + kRowsPerBlock - 1) / kRowsPerBlock) * sizeof(Best);
}

void dspark_markov(float* logits, int n_blocks, int vocab, const float* w1, const float* w2, int rank,
                   const int32_t* ids, int block, int n_slots, const float* h, int hidden, const float* conf_w,
                   int conf_cols, float conf_b, int32_t* tokens, float* conf, void* scratch, cudaStream_t stream) {
  if (n_blocks == 0 || n_slots == 0) return;
  const int n_parts = (vocab + kRowsPerBlock - 1) / kRowsPerBlock;
  Best* part = static_cast<Best*>(scratch);
  for (int k = 0; k < n_slots; ++k) {
    markov_rows_kernel<<<dim3(n_parts, n_blocks), kRowThreads, 0, stream>>>(logits, vocab, w1, w2, rank, ids, block, k,
                                                                            tokens, part);
    CUDA_CHECK_LAUNCH();
    markov_pick_kernel<<<n_blocks, kThreads, 0, stream>>>(part, n_parts, w1, rank, ids, block, k, h, hidden, conf_w,
                                                          conf_cols, conf_b, tokens, conf);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace moonrun::cuda
