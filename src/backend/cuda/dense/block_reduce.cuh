#pragma once
// Warp and block reductions for the one-block-per-row kernels (RMSNorm, the AttnRes mix,
// sampling). Sums are in the caller's type: the CPU references accumulate sums of squares
// in double, and so do their twins.
#include <cuda_runtime.h>

namespace moonrun::cuda {

constexpr unsigned kFullWarp = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(kFullWarp, v, offset));
  return v;
}

// Sum over the block; every thread gets the result. blockDim.x: a multiple of 32, <= 1024.
// shared: 32 slots. The leading __syncthreads() lets one `shared` serve consecutive calls
// (the previous call's readers are done before this call writes).
template <typename T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : T(0);
    w = warp_sum(w);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  return shared[0];
}

// Max over the block, same contract as block_sum; `lowest`: the identity (e.g. -INFINITY).
template <typename T>
__device__ T block_max(T v, T lowest, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : lowest;
    w = warp_max(w);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  return shared[0];
}

// Row kernels that hold their row in registers, four values a load: a block a row, thread i
// owning float4 chunks i, i + blockDim, ... (kChunks of them at most). Few rows (decode):
// 1024 threads of 2 chunks, so one row's loads are all in flight at once; many rows: 256
// threads of 8. Fewer threads where the row is narrow. chunks = 0: the row is wider than
// 2048 chunks (the caller's scalar kernel takes it).
struct VecRowLaunch {
  int threads = 0;
  int chunks = 0;
};
inline VecRowLaunch vec_row_launch(int n_rows, int n4) {
  const bool few = n_rows < 132;  // an H200's multiprocessors
  const int chunks = few ? 2 : 8, max_threads = few ? 1024 : 256;
  if (n4 <= 0 || n4 > chunks * max_threads) return {};
  const int threads = ((n4 + chunks - 1) / chunks + 31) / 32 * 32;
  return {threads, chunks};
}
constexpr int vec_row_max_threads(int chunks) { return chunks == 2 ? 1024 : 256; }

}  // namespace moonrun::cuda
