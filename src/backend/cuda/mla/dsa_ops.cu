// DeepSeek Sparse Attention's lightning indexer on the GPU (issue 38, build item 3): the twins
// of CpuOps::dsa_index_store / dsa_index_scores / dsa_topk (backend/cpu/dsa.cpp), first as
// reference kernels: fp32 on CUDA cores over an indexer-key pool of F32 rows or of FP8 rows
// with a scale (backend/dsa_index_row.h: 132 bytes a key instead of 512). What the fast path
// adds later (scores on the tensor cores, a top-k that streams 1M scores by blocks) is
// measured against these.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common/check.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/mma.cuh"
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

// -inf into row[from, to), by the whole block: the scores of positions past a token's own.
__device__ __forceinline__ void mask_scores(float* row, int64_t from, int64_t to) {
  for (int64_t p = from + threadIdx.x; p < to; p += blockDim.x) row[p] = -INFINITY;
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
    mask_scores(row, p0, min(p0 + kPositionsPerBlock, cols));
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

// ---- the scores on the tensor cores (dsa_fast(), FP8 keys, bf16 math) --------------------
// FP8 key codes widen to bf16 exactly; the query is rounded to bf16 (DeepSeek-V3.2's
// reference quantises it to FP8, coarser still), the products accumulate in fp32 on
// mma.m16n8k16, and ReLU, the head weights and the row's scale (a power of two > 0, so it
// commutes with ReLU) are applied in fp32 after. A warp takes 16 positions at a time: A is
// their 16 key rows (staged in shared memory as bf16), B the token's queries (heads as the
// n side, held in registers for the whole block), C 16 positions x 8 heads per n-tile; the
// head sum is a quad's shuffle. kNTiles = heads / 8, head_dim 128.
constexpr int kMmaScoreWarps = 8;
constexpr int kMmaScoreIters = 8;  // 16-position tiles a warp per block
constexpr int kMmaPositionsPerBlock = kMmaScoreWarps * 16 * kMmaScoreIters;
constexpr int kMmaIndexDim = 128;
constexpr int kMmaKeyStride = kMmaIndexDim + 8;  // bf16 a shared row (+16 B: no bank conflicts on A loads)

// Four e4m3 codes -> four bf16 (exact), into dst[0..3].
__device__ __forceinline__ void widen_fp8x4(uint32_t v, bf16* dst) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(v >> (16 * i));
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
    *reinterpret_cast<__nv_bfloat162*>(dst + 2 * i) = __floats2bfloat162_rn(f.x, f.y);
  }
}

template <int kNTiles>
__global__ void __launch_bounds__(kMmaScoreWarps * 32) index_scores_mma_kernel(
    const float* __restrict__ q, const float* __restrict__ weights, float scale, BatchTables batch,
    PagedRows<uint8_t> pool, float* __restrict__ scores, int64_t cols, int first_token) {
  constexpr int H = kNTiles * 8;
  __shared__ __align__(16) bf16 q_s[H * kMmaKeyStride];
  __shared__ __align__(16) bf16 key_s[kMmaScoreWarps][16 * kMmaKeyStride];
  __shared__ float w_s[H];
  __shared__ float row_scale[kMmaScoreWarps][16];
  const int r = blockIdx.x, t = first_token + r;  // the block's row, the batch's token
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int visible = batch.positions[t] + 1;
  const int64_t p0 = static_cast<int64_t>(blockIdx.y) * kMmaPositionsPerBlock;
  float* row = scores + static_cast<int64_t>(r) * cols;
  if (p0 >= visible) {  // all masked: no loads
    mask_scores(row, p0, min(p0 + kMmaPositionsPerBlock, cols));
    return;
  }
  for (int i = threadIdx.x; i < H * kMmaIndexDim; i += blockDim.x)
    q_s[(i / kMmaIndexDim) * kMmaKeyStride + i % kMmaIndexDim] =
        __float2bfloat16_rn(q[static_cast<int64_t>(r) * H * kMmaIndexDim + i]);
  for (int h = threadIdx.x; h < H; h += blockDim.x) w_s[h] = weights[static_cast<int64_t>(r) * H + h] * scale;
  __syncthreads();
  uint32_t bq[kNTiles][kMmaIndexDim / 16][2];
  float wv[kNTiles][2];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const bf16* qh = q_s + (8 * j + g) * kMmaKeyStride + 2 * tq;
#pragma unroll
    for (int ks = 0; ks < kMmaIndexDim / 16; ++ks) {
      bq[j][ks][0] = bf16_pair(qh + 16 * ks);
      bq[j][ks][1] = bf16_pair(qh + 16 * ks + 8);
    }
    wv[j][0] = w_s[8 * j + 2 * tq];
    wv[j][1] = w_s[8 * j + 2 * tq + 1];
  }
  const int32_t* pages = batch.page_table + batch.seqs[batch.token_seq[t]].page_start;
  bf16* keys = key_s[warp];
  for (int it = 0; it < kMmaScoreIters; ++it) {
    const int64_t pt = p0 + static_cast<int64_t>(it * kMmaScoreWarps + warp) * 16;  // the warp's 16 positions
    if (pt >= cols || pt >= visible) break;  // warp-uniform; masked tails are written below
    {
      // Lane l stages half (l % 2) of row l / 2: 16 words of codes (132-byte rows are 4-byte aligned).
      const int rr = lane / 2, half = lane % 2;
      const int64_t p = pt + rr;
      bf16* dst = keys + rr * kMmaKeyStride + half * 64;
      if (p < visible) {
        const uint8_t* src = pool.at(pages, static_cast<int>(p));
        const uint32_t* w32 = reinterpret_cast<const uint32_t*>(src) + half * 16;
        uint32_t v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = w32[i];
#pragma unroll
        for (int i = 0; i < 16; ++i) widen_fp8x4(v[i], dst + 4 * i);
        if (half == 0) row_scale[warp][rr] = *reinterpret_cast<const float*>(src + kMmaIndexDim);
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) *reinterpret_cast<uint2*>(dst + 4 * i) = make_uint2(0, 0);
        if (half == 0) row_scale[warp][rr] = 0;
      }
    }
    __syncwarp();
    float c[kNTiles][4];
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0;
    const bf16* ka = keys + g * kMmaKeyStride + 2 * tq;
    const bf16* kb = ka + 8 * kMmaKeyStride;
#pragma unroll
    for (int ks = 0; ks < kMmaIndexDim / 16; ++ks) {
      const uint32_t a0 = bf16_pair(ka + 16 * ks), a1 = bf16_pair(kb + 16 * ks);
      const uint32_t a2 = bf16_pair(ka + 16 * ks + 8), a3 = bf16_pair(kb + 16 * ks + 8);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) mma_m16n8k16_bf16(c[j], a0, a1, a2, a3, bq[j][ks][0], bq[j][ks][1]);
    }
    float s0 = 0, s1 = 0;  // positions pt + g, pt + g + 8
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      s0 += wv[j][0] * fmaxf(c[j][0], 0.0f) + wv[j][1] * fmaxf(c[j][1], 0.0f);
      s1 += wv[j][0] * fmaxf(c[j][2], 0.0f) + wv[j][1] * fmaxf(c[j][3], 0.0f);
    }
    s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
    s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
    if (tq == 0) {
      const int64_t pa = pt + g, pb = pt + g + 8;
      if (pa < cols) row[pa] = pa < visible ? s0 * row_scale[warp][g] : -INFINITY;
      if (pb < cols) row[pb] = pb < visible ? s1 * row_scale[warp][g + 8] : -INFINITY;
    }
    __syncwarp();  // the staged rows are read before the next tile overwrites them
  }
  // The block's positions past the token's (a warp stopped at them): -inf.
  mask_scores(row, max(p0, static_cast<int64_t>(visible)), min(p0 + kMmaPositionsPerBlock, cols));
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

// ---- the fast top-k (dsa_fast()) -------------------------------------------------------
// The same selection as topk_kernel in three radix passes of 11, 11 and 10 bits over a
// 2,048-bin histogram, then one pass that writes the kept positions a tile at a time. What
// made the reference slow (0.57 ms over 131k scores on an H100, one block a token whatever
// the batch) was its histogram: scores of one magnitude share their top byte, so 256
// threads added into the same shared counter one after another. Here a warp's lanes with
// the same bin add once (match.any), a bin's count is found by one block-wide scan, and the
// write pass scans once a tile of 4 scores a thread (above and equal counts packed into one
// int) instead of twice per 256 scores.
//
// Long rows with few tokens (one sequence at 1M: one block would read 4 MB five times) go
// in two kernels: slices of the row each keep their own top k (as (position, key) pairs in
// position order, padded with position -1), then one block a token takes the top k of the
// slices' union. Exact: an element of the row's top k under (score descending, position
// ascending) has fewer than k elements before it in its slice too, so its slice kept it;
// and the union, slice after slice, is in position order.
constexpr int kFastTopkThreads = 1024;
constexpr int kFastTopkBins = 2048;
constexpr int kFastTopkPerThread = 4;  // elements a thread per tile of the write pass
constexpr int kFastTopkTile = kFastTopkThreads * kFastTopkPerThread;
constexpr int kTopkSliceMin = 32768;   // the two-kernel path: slices of at least this many scores
constexpr int kTopkMaxSlices = 32;

using TopkScan = cub::BlockScan<int, kFastTopkThreads>;
struct TopkShared {
  typename TopkScan::TempStorage scan;
  int hist[kFastTopkBins];
  uint32_t prefix;
  int remaining;
};

// A row's scores: element i is position first + i.
struct ScoreReader {
  const float* row;
  int first, n;
  __device__ bool get(int i, uint32_t& u, int& p) const {
    if (i >= n) return false;
    u = ordered(row[i]);
    p = first + i;
    return true;
  }
};
// The slices' kept pairs, slice after slice (position -1: padding).
struct CandidateReader {
  const int32_t* pos;
  const uint32_t* key;
  int n;
  __device__ bool get(int i, uint32_t& u, int& p) const {
    if (i >= n) return false;
    p = pos[i];
    u = key[i];
    return p >= 0;
  }
};

// The block's top k of the reader's valid elements, written in position order to
// out_pos[0, k) (and their keys to out_key, when given), padded with -1 (key 0).
template <class Reader>
__device__ void block_topk(const Reader& rd, int k, TopkShared& sh, int32_t* __restrict__ out_pos,
                           uint32_t* __restrict__ out_key) {
  const int tid = threadIdx.x, lane = tid % 32;
  if (tid == 0) {
    sh.prefix = 0;
    sh.remaining = k;
  }
  uint32_t mask = 0, kth = 0;
  int ties = 0;
  bool keep_all = false;
  constexpr int kShifts[3] = {21, 10, 0};
  constexpr int kBits[3] = {11, 11, 10};
  const int rounds = (rd.n + kFastTopkThreads - 1) / kFastTopkThreads;
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShifts[pass];
    const uint32_t digit_mask = (1u << kBits[pass]) - 1;
    for (int i = tid; i < kFastTopkBins; i += kFastTopkThreads) sh.hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    // Every lane of the warp runs each round (the bound is block-uniform), so match.any
    // sees the whole warp; a lane past the end, invalid or outside the prefix adds nothing.
#pragma unroll 4
    for (int round = 0; round < rounds; ++round) {
      uint32_t u = 0;
      int p;
      const bool valid = rd.get(round * kFastTopkThreads + tid, u, p);
      const bool counts = valid && (u & mask) == prefix;
      const uint32_t bin = counts ? (u >> shift) & digit_mask : 0xffffffffu;
      const uint32_t peers = __match_any_sync(0xffffffffu, bin);
      if (counts && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], __popc(peers));
    }
    __syncthreads();
    // The bin holding the remaining-th largest: thread i owns bins B-1-2i and B-2-2i; an
    // exclusive scan gives the count above its pair.
    const int top = kFastTopkBins - 1 - 2 * tid;
    const int c0 = sh.hist[top], c1 = sh.hist[top - 1];
    int above, total;
    TopkScan(sh.scan).ExclusiveSum(c0 + c1, above, total);
    const int remaining = sh.remaining;
    if (pass == 0 && total <= k) {  // every valid element is kept (uniform: total is the block's)
      keep_all = true;
      break;
    }
    __syncthreads();  // every thread has read sh.remaining and sh.prefix
    if (above < remaining && above + c0 + c1 >= remaining) {
      const bool first = above + c0 >= remaining;
      sh.remaining = first ? remaining - above : remaining - above - c0;
      sh.prefix = prefix | (static_cast<uint32_t>(first ? top : top - 1) << shift);
    }
    mask |= digit_mask << shift;
    __syncthreads();
  }
  if (!keep_all) {
    kth = sh.prefix;
    ties = sh.remaining;  // how many of the keys equal to kth are kept: the lowest positions
  }
  __syncthreads();  // the scan storage is free again (also after the keep-all break)
  int written = 0, eq_seen = 0;  // over the tiles before this one (the same in every thread)
  for (int base = 0; base < rd.n; base += kFastTopkTile) {
    // Thread i takes the tile's elements base + 4i .. base + 4i + 3 (in position order).
    uint32_t u[kFastTopkPerThread];
    int p[kFastTopkPerThread];
    bool above[kFastTopkPerThread], equal[kFastTopkPerThread];
    int n_above = 0, n_equal = 0;
#pragma unroll
    for (int j = 0; j < kFastTopkPerThread; ++j) {
      const bool valid = rd.get(base + kFastTopkPerThread * tid + j, u[j], p[j]);
      above[j] = valid && (keep_all || u[j] > kth);
      equal[j] = valid && !keep_all && u[j] == kth;
      n_above += above[j];
      n_equal += equal[j];
    }
    int before, total;
    TopkScan(sh.scan).ExclusiveSum(n_above | (n_equal << 16), before, total);  // a tile holds < 2^16 of each
    const int above_before = before & 0xffff, eq_before = eq_seen + (before >> 16);
    int slot = written + above_before + min(eq_before, ties) - min(eq_seen, ties);
    int eq_mine = eq_before;
#pragma unroll
    for (int j = 0; j < kFastTopkPerThread; ++j) {
      if (above[j] || (equal[j] && eq_mine++ < ties)) {
        out_pos[slot] = p[j];
        if (out_key) out_key[slot] = u[j];
        ++slot;
      }
    }
    const int tile_above = total & 0xffff, tile_equal = total >> 16;
    written += tile_above + min(eq_seen + tile_equal, ties) - min(eq_seen, ties);
    eq_seen += tile_equal;
    __syncthreads();  // the scan storage is reused by the next tile
  }
  for (int j = written + tid; j < k; j += kFastTopkThreads) {
    out_pos[j] = -1;
    if (out_key) out_key[j] = 0;
  }
}

// grid n_tokens, kFastTopkThreads: a token's row in one block.
__global__ void __launch_bounds__(kFastTopkThreads) topk_fast_kernel(const float* __restrict__ scores, int64_t cols,
                                                                     BatchTables batch, int first_token, int k,
                                                                     int32_t* __restrict__ out) {
  __shared__ TopkShared sh;
  const int r = blockIdx.x, t = first_token + r;  // the block's row, the batch's token
  const int visible = min(static_cast<int64_t>(batch.positions[t]) + 1, cols);
  const ScoreReader rd{scores + static_cast<int64_t>(r) * cols, 0, visible};
  block_topk(rd, k, sh, out + static_cast<int64_t>(r) * k, nullptr);
}

// grid (n_tokens, n_slices), kFastTopkThreads: slice s of a token's visible scores (of
// ceil(visible / n_slices) each) keeps its top k into cand_pos / cand_key [n_tokens,
// n_slices, k].
__global__ void __launch_bounds__(kFastTopkThreads) topk_slices_kernel(const float* __restrict__ scores, int64_t cols,
                                                                       BatchTables batch, int first_token, int k,
                                                                       int32_t* __restrict__ cand_pos,
                                                                       uint32_t* __restrict__ cand_key) {
  __shared__ TopkShared sh;
  const int r = blockIdx.x, t = first_token + r, slice = blockIdx.y, n_slices = gridDim.y;
  const int visible = min(static_cast<int64_t>(batch.positions[t]) + 1, cols);
  const int span = (visible + n_slices - 1) / n_slices;
  const int begin = min(visible, slice * span), end = min(visible, begin + span);
  const ScoreReader rd{scores + static_cast<int64_t>(r) * cols + begin, begin, end - begin};
  const int64_t at = (static_cast<int64_t>(r) * n_slices + slice) * k;
  block_topk(rd, k, sh, cand_pos + at, cand_key + at);
}

// grid n_tokens, kFastTopkThreads: the top k of a token's slices' kept pairs.
__global__ void __launch_bounds__(kFastTopkThreads) topk_merge_kernel(const int32_t* __restrict__ cand_pos,
                                                                      const uint32_t* __restrict__ cand_key,
                                                                      int n_slices, int k, int32_t* __restrict__ out) {
  __shared__ TopkShared sh;
  const int r = blockIdx.x;
  const int64_t at = static_cast<int64_t>(r) * n_slices * k;
  const CandidateReader rd{cand_pos + at, cand_key + at, n_slices * k};
  block_topk(rd, k, sh, out + static_cast<int64_t>(r) * k, nullptr);
}

bool dsa_fast_from_env() {
  const char* v = std::getenv("MOONRUN_DSA_FAST");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}
bool g_dsa_fast = dsa_fast_from_env();

}  // namespace

void set_dsa_fast(bool on) { g_dsa_fast = on; }
bool dsa_fast() { return g_dsa_fast; }

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
                      float scale, const BatchTables& batch, const KvLayer& pool, bool bf16_math, float* scores,
                      int64_t cols, cudaStream_t stream) {
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
  if (dsa_fast() && bf16_math && pool.dtype == DType::F8_E4M3 && dim == kMmaIndexDim && heads % 8 == 0 &&
      heads <= 32) {
    const dim3 mma_grid(n_tokens, static_cast<unsigned>((cols + kMmaPositionsPerBlock - 1) / kMmaPositionsPerBlock));
    auto mma = [&](auto kernel) {
      kernel<<<mma_grid, kMmaScoreWarps * 32, 0, stream>>>(q, weights, scale, batch, paged_rows<uint8_t>(pool), scores,
                                                           cols, first_token);
    };
    switch (heads / 8) {
      case 1: mma(index_scores_mma_kernel<1>); break;
      case 2: mma(index_scores_mma_kernel<2>); break;
      case 3: mma(index_scores_mma_kernel<3>); break;
      default: mma(index_scores_mma_kernel<4>); break;
    }
  } else if (pool.dtype == DType::F8_E4M3) {
    launch(index_scores_kernel<uint8_t>, paged_rows<uint8_t>(pool));
  } else {
    launch(index_scores_kernel<float>, paged_rows<float>(pool));
  }
  CUDA_CHECK_LAUNCH();
}

// Slices a row for the two-kernel top-k: enough blocks to fill ~the SMs when few tokens
// select over long rows, each slice kTopkSliceMin scores at least and holding more than k
// (else one block a token). From the columns only (not the positions), so a captured
// decode graph keeps its launch shape at every context its width covers.
static int topk_slices(int n_tokens, int64_t cols, int k) {
  if (!dsa_fast() || n_tokens <= 0) return 1;
  const int64_t by_length = cols / std::max<int64_t>(kTopkSliceMin, 2 * static_cast<int64_t>(k));
  const int by_blocks = std::max(1, 132 / n_tokens);
  return static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(by_length, by_blocks), 1, kTopkMaxSlices));
}

size_t dsa_topk_workspace_bytes(int n_tokens, int64_t cols, int k) {
  const int n_slices = topk_slices(n_tokens, cols, k);
  return n_slices > 1 ? static_cast<size_t>(n_tokens) * n_slices * k * (sizeof(int32_t) + sizeof(uint32_t)) : 0;
}

void dsa_topk(const float* scores, int first_token, int n_tokens, int64_t cols, const BatchTables& batch, int k,
              int32_t* indices, void* workspace, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  if (dsa_fast()) {
    const int n_slices = topk_slices(n_tokens, cols, k);
    if (n_slices > 1) {
      MR_CHECK(workspace != nullptr) << "dsa_topk: the slices' workspace";
      int32_t* cand_pos = static_cast<int32_t*>(workspace);
      uint32_t* cand_key = reinterpret_cast<uint32_t*>(cand_pos + static_cast<size_t>(n_tokens) * n_slices * k);
      topk_slices_kernel<<<dim3(n_tokens, n_slices), kFastTopkThreads, 0, stream>>>(scores, cols, batch, first_token,
                                                                                   k, cand_pos, cand_key);
      CUDA_CHECK_LAUNCH();
      topk_merge_kernel<<<n_tokens, kFastTopkThreads, 0, stream>>>(cand_pos, cand_key, n_slices, k, indices);
    } else {
      topk_fast_kernel<<<n_tokens, kFastTopkThreads, 0, stream>>>(scores, cols, batch, first_token, k, indices);
    }
  } else
    topk_kernel<<<n_tokens, kTopkThreads, 0, stream>>>(scores, cols, batch, first_token, k, indices);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
