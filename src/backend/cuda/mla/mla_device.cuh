#pragma once
// Device-side pieces shared by the MLA kernels (mla_cache.cu, mla_attention.cu): the paged
// cache row address, loads that widen bf16 to fp32, and block reductions. Internal to
// src/backend/cuda/mla.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/mla/mla_ops.h"

namespace moonrun::cuda::mla_detail {

// Every MLA kernel runs 256 threads (8 warps) per block.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The cache's element types: float (--dtype float32), bf16, and fp8 e4m3 (--kv-cache-dtype
// fp8: stored rounded to nearest even and saturated at +-448, scale 1; the CPU's
// f32_to_f8e4m3 is the same rounding).
using fp8 = __nv_fp8_e4m3;

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const fp8* p) { return static_cast<float>(*p); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st(fp8* p, float v) { *p = fp8(v); }  // cvt.rn.satfinite.e4m3x2

// Calls f(TypeTag<Cache>{}) with the element type of a cache of dtype d, so one launch site
// serves the three cache types.
template <typename T>
struct TypeTag {
  using type = T;
};
template <typename F>
void with_cache_type(DType d, F&& f) {
  if (d == DType::BF16) f(TypeTag<bf16>{});
  else if (d == DType::F8_E4M3) f(TypeTag<fp8>{});
  else f(TypeTag<float>{});
}

// One layer of the paged cache with rows of element type Cache.
template <typename Cache>
struct PagedRows {
  Cache* base = nullptr;
  int page_size = 0;
  int row = 0;
  // The row of position p of a sequence whose page table is `pages`.
  __device__ __forceinline__ Cache* at(const int32_t* pages, int p) const {
    const int page = pages[p / page_size];
    return base + (static_cast<int64_t>(page) * page_size + p % page_size) * row;
  }
};
template <typename Cache>
inline PagedRows<Cache> paged_rows(const KvLayer& c) {
  return PagedRows<Cache>{static_cast<Cache*>(c.base), c.page_size_tokens, c.row_width};
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

// Whether token t is one the batched (absorbed) kernels compute.
__device__ __forceinline__ bool computes(const BatchTables& b, int t, bool only_short_seqs) {
  return !only_short_seqs || b.seqs[b.token_seq[t]].n_new <= kShortSeqMaxNewTokens;
}

// DSA (issue 38): how many positions a selected row [k] (dsa_topk's: increasing positions,
// then -1s) lists, for a token with `visible` positions. The top-k keeps min(k, visible),
// which two reads confirm; any other row is bisected for its first -1 (11 reads at k =
// 2,048, where a scan read up to k in turn).
__device__ __forceinline__ int selected_count(const int32_t* row, int k, int visible) {
  const int expected = min(k, visible);
  if (expected > 0 && row[expected - 1] >= 0 && (expected == k || row[expected] < 0)) return expected;
  int lo = 0, hi = k;  // row[0, lo) >= 0, row[hi, k) < 0
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (row[mid] >= 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

}  // namespace moonrun::cuda::mla_detail
