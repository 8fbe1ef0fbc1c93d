// Greedy sampling of whole batches (sample_ops.h's argmax_rows): the argmax of each logits
// row, the lowest id on ties - the token sample_rows' greedy branch and the CPU's
// std::max_element pick.
//
// Why not sample_rows. Its one block per row reads K3's 163840 logits (640 KiB) on one SM,
// twice (the max, then its first index), at that SM's latency-bound rate: most of the
// ~0.2 ms the sampler cost per step at batch 1 (issue #12). Here each row is cut into
// ~4096-logit chunks, one block each (40 blocks for K3's vocab), every thread with its four
// 16-byte loads in flight; each block leaves its (max, lowest index) pair, and a one-warp
// block per row folds them.
//
// The order is total: (v, i) beats (w, j) iff v > w, or v == w and i < j. NaN never wins
// (like fmaxf in sample_rows, whose max ignores NaN), -0 and +0 are equal values (ties go to
// the lower id, as ==); a row with no non-NaN value gives 0, as sample_rows does. The answer
// is the maximum under that order, so it does not depend on how the work is cut.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/dense/block_reduce.cuh"
#include "backend/cuda/sample/sample_ops.h"

namespace moonrun::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 16;  // logits per thread and block: four float4 loads
constexpr int kPerBlock = kThreads * kPerThread;
constexpr int kMaxBlocksPerRow = 1024;

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

int blocks_per_row(int vocab) { return std::max(1, std::min(kMaxBlocksPerRow, ceil_div(vocab, kPerBlock))); }
// Logits per block: a multiple of 4, so that every block's start keeps a row's 16-byte alignment.
int chunk_of(int vocab) { return ceil_div(ceil_div(vocab, blocks_per_row(vocab)), 4) * 4; }

struct Best {
  float v;
  int i;
};

__device__ __forceinline__ void take(Best& b, float v, int i) {
  if (v > b.v || (v == b.v && i < b.i)) b = Best{v, i};
}

__device__ __forceinline__ Best warp_best(Best b) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(kFullWarp, b.v, offset);
    const int i = __shfl_xor_sync(kFullWarp, b.i, offset);
    take(b, v, i);
  }
  return b;
}

// grid (blocks used per row, n_rows), kThreads threads: partials[row * gridDim.x + block].
__global__ void __launch_bounds__(kThreads)
    argmax_partial_kernel(const float* __restrict__ logits, int vocab, int chunk, ArgmaxPartial* __restrict__ partials) {
  __shared__ Best warp_results[kThreads / 32];
  const float* row = logits + static_cast<int64_t>(blockIdx.y) * vocab;
  const int begin = static_cast<int>(blockIdx.x) * chunk;
  const int end = min(vocab, begin + chunk);
  Best b{-INFINITY, INT_MAX};
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    // begin is a multiple of 4: row + begin is 16-byte aligned too. The logits are read once.
    const int n4 = max(0, end - begin) / 4;
    const float4* row4 = reinterpret_cast<const float4*>(row + begin);
#pragma unroll 4
    for (int j = threadIdx.x; j < n4; j += kThreads) {
      const float4 v = __ldcs(row4 + j);
      const int i = begin + 4 * j;
      take(b, v.x, i);
      take(b, v.y, i + 1);
      take(b, v.z, i + 2);
      take(b, v.w, i + 3);
    }
    for (int i = begin + 4 * n4 + static_cast<int>(threadIdx.x); i < end; i += kThreads) take(b, row[i], i);
  } else {  // rows of a vocab that is not a multiple of 4
    for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kThreads) take(b, row[i], i);
  }
  b = warp_best(b);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = b;
  __syncthreads();
  if (warp != 0) return;
  b = lane < kThreads / 32 ? warp_results[lane] : Best{-INFINITY, INT_MAX};
  b = warp_best(b);
  if (lane == 0) partials[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = ArgmaxPartial{b.v, b.i};
}

// One warp per row folds the row's n_blocks partials.
__global__ void argmax_final_kernel(const ArgmaxPartial* __restrict__ partials, int n_blocks,
                                    int32_t* __restrict__ out_ids) {
  const ArgmaxPartial* p = partials + static_cast<int64_t>(blockIdx.x) * n_blocks;
  Best b{-INFINITY, INT_MAX};
  for (int j = threadIdx.x; j < n_blocks; j += 32) take(b, p[j].value, p[j].index);
  b = warp_best(b);
  if (threadIdx.x == 0) out_ids[blockIdx.x] = b.i == INT_MAX ? 0 : b.i;
}

}  // namespace

int argmax_partials(int n_rows, int vocab) { return n_rows * blocks_per_row(vocab); }

void argmax_rows(const float* logits, int n_rows, int vocab, ArgmaxPartial* partials, int32_t* out_ids,
                 cudaStream_t stream) {
  if (n_rows <= 0) return;
  if (vocab <= 0) throw CudaError("argmax_rows: empty logits rows");
  if (n_rows > 65535) throw CudaError("argmax_rows: " + std::to_string(n_rows) + " rows (at most 65535)");
  const int chunk = chunk_of(vocab);
  const int n_blocks = ceil_div(vocab, chunk);  // <= blocks_per_row(vocab): every block has logits
  argmax_partial_kernel<<<dim3(n_blocks, n_rows), kThreads, 0, stream>>>(logits, vocab, chunk, partials);
  CUDA_CHECK_LAUNCH();
  argmax_final_kernel<<<n_rows, 32, 0, stream>>>(partials, n_blocks, out_ids);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
