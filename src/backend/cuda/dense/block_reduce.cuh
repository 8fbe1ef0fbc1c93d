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

}  // namespace moonrun::cuda
