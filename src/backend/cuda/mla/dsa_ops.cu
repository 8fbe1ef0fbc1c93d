// DeepSeek Sparse Attention's lightning indexer on the GPU (issue 38, build item 3): the twins
// of CpuOps::dsa_index_store / dsa_index_scores / dsa_topk (backend/cpu/dsa.cpp), first as
// reference kernels: fp32 on CUDA cores over an indexer-key pool of F32 rows or of FP8 rows
// with a scale (backend/dsa_index_row.h: 132 bytes a key instead of 512). What the fast path
// adds later (scores on the tensor cores, a top-k that streams 1M scores by blocks) is
// measured against these.
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/dsa_index_row.h"
#include "backend/cuda/mla/dsa_ops.h"
#include "backend/cuda/mla/mla_device.cuh"

namespace moonrun::cuda {

using namespace mla_detail;

namespace {

// grid n_tokens, kThreads: LayerNorm(k[t]) * w + b into the pool row of t's position: F32
// values, or (kFp8) e4m3 codes of value / scale and the scale (backend/dsa_index_row.h).
template <typename Row>
__global__ void index_store_kernel(const float* __restrict__ k, int dim, const float* __restrict__ w,
                                   const float* __restrict__ b, float eps, BatchTables batch, PagedRows<Row> pool) {
  constexpr bool kFp8 = sizeof(Row) == 1;
  __shared__ float red[kWarps];
  const int t = blockIdx.x;
  const float* x = k + static_cast<int64_t>(t) * dim;
  float s = 0;
  for (int i = threadIdx.x; i < dim; i += kThreads) s += x[i];
  const float mean = block_sum(s, red) / static_cast<float>(dim);
  float v = 0;
  for (int i = threadIdx.x; i < dim; i += kThreads) v += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.0f / sqrtf(block_sum(v, red) / static_cast<float>(dim) + eps);
  const int32_t* pages = batch.page_table + batch.seqs[batch.token_seq[t]].page_start;
  if constexpr (!kFp8) {
    float* dst = pool.at(pages, batch.positions[t]);
    for (int i = threadIdx.x; i < dim; i += kThreads) dst[i] = (x[i] - mean) * inv * w[i] + b[i];
  } else {
    uint8_t* dst = pool.at(pages, batch.positions[t]);
    float amax = 0;
    for (int i = threadIdx.x; i < dim; i += kThreads) amax = fmaxf(amax, fabsf((x[i] - mean) * inv * w[i] + b[i]));
    const float scale = dsa_index_scale(block_max(amax, red)), to_code = 1.0f / scale;  // exact: a power of two
    for (int i = threadIdx.x; i < dim; i += kThreads) {
      dst[i] = __nv_cvt_float_to_fp8(((x[i] - mean) * inv * w[i] + b[i]) * to_code, __NV_SATFINITE, __NV_E4M3);
    }
    if (threadIdx.x == 0) *reinterpret_cast<float*>(dst + dim) = scale;  // 4-byte aligned: rows of dim + 4, dim % 4 == 0
  }
}

// One key row of the pool as floats, into a warp's shared row (lanes over the values).
__device__ __forceinline__ void load_key(const float* kp, int dim, int lane, float* key) {
  for (int d = lane; d < dim; d += 32) key[d] = kp[d];
}
__device__ __forceinline__ void load_key(const uint8_t* kp, int dim, int lane, float* key) {
  const float scale = *reinterpret_cast<const float*>(kp + dim);
  for (int d = lane; d < dim; d += 32) {
    __nv_fp8_e4m3 c;
    c.__x = kp[d];
    key[d] = static_cast<float>(c) * scale;
  }
}

constexpr int kScoreWarps = 8;                      // positions scored at once by a block
constexpr int kPositionsPerBlock = kScoreWarps * 32;

// grid (n_tokens, ceil(cols / kPositionsPerBlock)), kScoreWarps warps. Token t's row of
// scores: column p <= pos_t is sum_h w[t, h] * scale * ReLU(q[t, h] . key[p]), the rest -inf.
// Shared: q[t] with rows padded to dim + 1 (lane h reads row h: no bank conflicts), the
// scaled weights, one key row per warp.
template <typename Row>
__global__ void index_scores_kernel(const float* __restrict__ q, const float* __restrict__ weights, int heads,
                                    int dim, float scale, BatchTables batch, PagedRows<Row> pool,
                                    float* __restrict__ scores, int64_t cols, int first_token) {
  extern __shared__ float smem[];
  float* q_s = smem;                                      // [heads, dim + 1]
  float* w_s = q_s + static_cast<int64_t>(heads) * (dim + 1);  // [heads]
  float* key_s = w_s + heads;                             // [kScoreWarps, dim]
  const int r = blockIdx.x, t = first_token + r;  // the block's row, the batch's token
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int visible = batch.positions[t] + 1;
  const int64_t p0 = static_cast<int64_t>(blockIdx.y) * kPositionsPerBlock;
  float* row = scores + static_cast<int64_t>(r) * cols;
  if (p0 >= visible) {  // all masked: no loads
    for (int i = threadIdx.x; i < kPositionsPerBlock && p0 + i < cols; i += blockDim.x) row[p0 + i] = -INFINITY;
    return;
  }
  for (int i = threadIdx.x; i < heads * dim; i += blockDim.x)
    q_s[(i / dim) * (dim + 1) + i % dim] = q[static_cast<int64_t>(r) * heads * dim + i];
  for (int h = threadIdx.x; h < heads; h += blockDim.x) w_s[h] = weights[static_cast<int64_t>(r) * heads + h] * scale;
  __syncthreads();
  const int32_t* pages = batch.page_table + batch.seqs[batch.token_seq[t]].page_start;
  float* key = key_s + warp * dim;
  for (int i = warp; i < kPositionsPerBlock; i += kScoreWarps) {
    const int64_t p = p0 + i;
    if (p >= cols) break;
    if (p >= visible) {
      if (lane == 0) row[p] = -INFINITY;
      continue;
    }
    load_key(pool.at(pages, static_cast<int>(p)), dim, lane, key);
    __syncwarp();
    float s = 0;
    for (int h = lane; h < heads; h += 32) {
      const float* qh = q_s + h * (dim + 1);
      float dot = 0;
      for (int d = 0; d < dim; ++d) dot += qh[d] * key[d];
      s += w_s[h] * fmaxf(dot, 0.0f);
    }
    s = warp_sum(s);
    if (lane == 0) row[p] = s;
    __syncwarp();  // the key row is read by all lanes before the next one overwrites it
  }
}

// Order-preserving map of a float to an unsigned integer (larger float, larger key).
__device__ __forceinline__ uint32_t ordered(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int kTopkThreads = 256;

// grid n_tokens, kTopkThreads. The top k of a row by (score descending, position ascending),
// written as increasing positions, then -1s; every visible position when k covers them.
// A radix select (8 bits a pass, most significant first) finds the k-th largest key; the
// positions above it and the first `ties` equal to it are then written in position order by
// block-wide prefix sums.
__global__ void __launch_bounds__(kTopkThreads) topk_kernel(const float* __restrict__ scores, int64_t cols,
                                                            BatchTables batch, int first_token, int k,
                                                            int32_t* __restrict__ out) {
  using Scan = cub::BlockScan<int, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining;
  __shared__ int s_eq_seen, s_written;
  const int r = blockIdx.x, t = first_token + r;  // the block's row, the batch's token
  const int visible = min(static_cast<int64_t>(batch.positions[t]) + 1, cols);
  const float* row = scores + static_cast<int64_t>(r) * cols;
  int32_t* dst = out + static_cast<int64_t>(r) * k;
  if (visible <= k) {
    for (int j = threadIdx.x; j < k; j += kTopkThreads) dst[j] = j < visible ? j : -1;
    return;
  }
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_remaining = k;
  }
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int p = threadIdx.x; p < visible; p += kTopkThreads) {
      const uint32_t u = ordered(row[p]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 0xff], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int remaining = s_remaining, bin = 255;
      for (; bin > 0 && hist[bin] < remaining; --bin) remaining -= hist[bin];
      s_remaining = remaining;  // still to take from this bin
      s_prefix = prefix | (static_cast<uint32_t>(bin) << shift);
    }
    mask |= 0xffu << shift;
    __syncthreads();
  }
  const uint32_t kth = s_prefix;
  const int ties = s_remaining;  // how many of the keys equal to kth are kept: the lowest positions
  if (threadIdx.x == 0) {
    s_eq_seen = 0;
    s_written = 0;
  }
  __syncthreads();
  for (int base = 0; base < visible; base += kTopkThreads) {
    const int p = base + threadIdx.x;
    const uint32_t u = p < visible ? ordered(row[p]) : 0;
    const bool above = p < visible && u > kth;
    const bool equal = p < visible && u == kth;
    int eq_before, eq_total;
    Scan(scan_tmp).ExclusiveSum(equal ? 1 : 0, eq_before, eq_total);
    __syncthreads();
    const bool keep = above || (equal && s_eq_seen + eq_before < ties);
    int slot, kept;
    Scan(scan_tmp).ExclusiveSum(keep ? 1 : 0, slot, kept);
    if (keep) dst[s_written + slot] = p;
    __syncthreads();
    if (threadIdx.x == 0) {
      s_eq_seen += eq_total;
      s_written += kept;
    }
    __syncthreads();
  }
}

}  // namespace

void dsa_index_store(const float* k, int n_tokens, int dim, const float* norm_w, const float* norm_b, float eps,
                     const BatchTables& batch, const KvLayer& pool, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  if (pool.dtype == DType::F8_E4M3)
    index_store_kernel<<<n_tokens, kThreads, 0, stream>>>(k, dim, norm_w, norm_b, eps, batch, paged_rows<uint8_t>(pool));
  else
    index_store_kernel<<<n_tokens, kThreads, 0, stream>>>(k, dim, norm_w, norm_b, eps, batch, paged_rows<float>(pool));
  CUDA_CHECK_LAUNCH();
}

void dsa_index_scores(const float* q, const float* weights, int first_token, int n_tokens, int heads, int dim,
                      float scale, const BatchTables& batch, const KvLayer& pool, float* scores, int64_t cols,
                      cudaStream_t stream) {
  if (n_tokens <= 0 || cols <= 0) return;
  const size_t smem = (static_cast<size_t>(heads) * (dim + 1) + heads + static_cast<size_t>(kScoreWarps) * dim) *
                      sizeof(float);
  const dim3 grid(n_tokens, static_cast<unsigned>((cols + kPositionsPerBlock - 1) / kPositionsPerBlock));
  auto launch = [&](auto kernel, auto rows) {
    if (smem > 48u * 1024)
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<grid, kScoreWarps * 32, smem, stream>>>(q, weights, heads, dim, scale, batch, rows, scores, cols,
                                                     first_token);
  };
  if (pool.dtype == DType::F8_E4M3) launch(index_scores_kernel<uint8_t>, paged_rows<uint8_t>(pool));
  else launch(index_scores_kernel<float>, paged_rows<float>(pool));
  CUDA_CHECK_LAUNCH();
}

void dsa_topk(const float* scores, int first_token, int n_tokens, int64_t cols, const BatchTables& batch, int k,
              int32_t* indices, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  topk_kernel<<<n_tokens, kTopkThreads, 0, stream>>>(scores, cols, batch, first_token, k, indices);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
