#pragma once
// Device-side pieces shared by the MLA kernels (mla_cache.cu, mla_attention.cu,
// mla_layer.cu): the paged cache row address, loads that widen bf16 to fp32, and block
// reductions. Internal to src/kernels/cuda/mla.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/mla/mla_layer.h"

namespace moonrun::cuda::mla_detail {

// Every MLA kernel runs 256 threads (8 warps) per block.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const bf16* p) { return __bfloat162float(*p); }

// The cache row of position p: layer_base + (pages[p / page_size] * page_size + p % page_size) * row.
__device__ __forceinline__ bf16* cache_row(const DeviceMlaCache& cache, int p, int row) {
  const int page = cache.pages[p / cache.page_size_tokens];
  const int64_t slot = static_cast<int64_t>(page) * cache.page_size_tokens + p % cache.page_size_tokens;
  return cache.layer_base + slot * row;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum / max of one value per thread over a kThreads block; every thread gets the result.
// red: kWarps floats of shared memory. Two barriers: the partials are complete before they
// are read, and read by all before a later call overwrites them.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0;
  for (int w = 0; w < kWarps; ++w) s += red[w];
  __syncthreads();
  return s;
}
__device__ __forceinline__ float block_max(float v, float* red) {
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float m = red[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  return m;
}

}  // namespace moonrun::cuda::mla_detail
