// Causal softmax attention of MLA on the GPU, both evaluation orders of the CPU's
// (backend/cpu/mla.cpp: mla_attend_plain, mla_attend_absorbed). fp32 scores, softmax and
// accumulators; keys and values are read as stored (fp32 kv_b output in plain mode, cache
// rows in absorbed mode).
//
//   plain     key_h(p) = [k_nope_h(p) | k_pe(p)],  value_h(p) = v_h(p)    (kv = kv_b(latents))
//   absorbed  key(p)   = row(p) = [c(p) | k_pe(p)], value(p) = c(p)       (one key for all heads)
//             with the query folded: q_abs_h = [W_uk_h^T q_nope_h | q_pe_h], and the output
//             unfolded afterwards: o_h = W_uv_h o_lat_h.
//
// One kernel, templated on where keys and values come from: one block per (token, head,
// split). The visible positions [0, pos] are walked in chunks of kChunk: each warp scores
// positions of the chunk (lanes split the dot product), then the block rescales its running
// softmax (max m, denominator l) and adds the chunk's weighted values, thread j owning output
// dims j, j + kThreads, ... So any context length works with a fixed amount of shared memory.
// Decode (few (token, head) pairs) splits the positions over several blocks as well and merges
// their partial softmaxes in a second kernel. The absorbed path reads each token's position
// and page table from the batch's device tables and sizes its splits from the token and
// head counts only, so one captured graph serves every context length.
// (H200, K3 shape, 500 cached positions, whole layer with projections, before the batched
// rewrite: decode 0.29 ms absorbed, a 4-token chunk 0.31 ms plain, a 512-token prompt 4.2 ms.)
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/check.h"
#include "backend/cuda/common/bulk_copy.cuh"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/mla/mla_device.cuh"

namespace moonrun::cuda {

using namespace mla_detail;

namespace {

constexpr int kChunk = 256;            // positions scored per round
constexpr int kMaxOutPerThread = 4;    // output dims per thread: up to 1024 (kv_lora 512 in K3)
// Position splits (decode): aim for this many blocks, no split shorter than this.
constexpr int kTargetBlocks = 1024;
constexpr int kMinSplitPositions = 64;
constexpr int kMaxSplits = 32;

// Plain mode (one sequence, one block of its keys): per-head keys and values expanded by
// kv_b over the block's latents, k_pe from the cache row. Token t sees the block's positions
// [key_begin, key_end) up to its own, n_past + t.
template <typename Cache>
struct PlainSource {
  const float* kv;  // [key_end - key_begin, H, nope + v]
  PagedRows<Cache> cache;
  const int32_t* pages;
  int n_past, num_heads, kv_lora, nope, v_dim, key_begin, key_end;
  __device__ int begin() const { return key_begin; }
  __device__ int bind(int t) { return min(n_past + t + 1, key_end); }
  __device__ const float* key_a(int p, int h) const {
    return kv + (static_cast<int64_t>(p - key_begin) * num_heads + h) * (nope + v_dim);
  }
  __device__ const Cache* key_b(int p) const { return cache.at(pages, p) + kv_lora; }
  __device__ const float* value(int p, int h) const { return key_a(p, h) + nope; }
};

// Absorbed mode (the batch): the cache row itself is the key ([c | k_pe]) and its latent the
// value; token t sees its sequence's positions [0, positions[t]].
template <typename Cache>
struct AbsorbedSource {
  using CacheType = Cache;
  PagedRows<Cache> cache;
  BatchTables batch;
  bool only_short_seqs;
  int kv_lora;
  const int32_t* pages = nullptr;  // set by bind
  __device__ int begin() const { return 0; }
  __device__ int bind(int t) {
    if (!computes(batch, t, only_short_seqs)) return 0;
    pages = batch.page_table + batch.seqs[batch.token_seq[t]].page_start;
    return batch.positions[t] + 1;
  }
  __device__ const Cache* key_a(int p, int) const { return cache.at(pages, p); }
  __device__ const Cache* key_b(int p) const { return cache.at(pages, p) + kv_lora; }
  __device__ const Cache* value(int p, int) const { return cache.at(pages, p); }
};

// Sparse absorbed mode (DSA, issue 38): token t reads only the positions listed in its row
// of `selected` [n_tokens, k] (dsa_topk's form: increasing positions, then -1s). The
// attention kernel's "position" j is an index into that row.
template <typename Cache>
struct SparseSource {
  using CacheType = Cache;
  PagedRows<Cache> cache;
  BatchTables batch;
  const int32_t* selected;
  int k, kv_lora;
  const int32_t* pages = nullptr;  // set by bind
  const int32_t* row = nullptr;
  __device__ int begin() const { return 0; }
  __device__ int bind(int t) {
    pages = batch.page_table + batch.seqs[batch.token_seq[t]].page_start;
    row = selected + static_cast<int64_t>(t) * k;
    return selected_count(row, k, batch.positions[t] + 1);
  }
  __device__ const Cache* key_a(int j, int) const { return cache.at(pages, row[j]); }
  __device__ const Cache* key_b(int j) const { return cache.at(pages, row[j]) + kv_lora; }
  __device__ const Cache* value(int j, int) const { return cache.at(pages, row[j]); }
};

// grid (n_tokens, H, n_splits), kThreads threads, dynamic shared memory (key_a_dim + rope +
// kChunk) floats. q [n_tokens, H, key_a_dim + rope] fp32. Split s of a token that sees
// positions [first, visible) covers [first + s * span, first + (s + 1) * span), span =
// ceil((visible - first) / n_splits). One split: o [n_tokens, H, out_dim] fp32, normalised
// (and, when lse is given, lse [n_tokens, H] the log-sum-exp of the scaled scores). Several:
// the split's unnormalised sum and its (max, denominator) go to part_acc [n_tokens, H,
// n_splits, out_dim] and part_ml [n_tokens, H, n_splits, 2] for combine_splits_kernel (an
// empty split leaves max -inf, denominator 0). A token the source does not compute
// (visible 0) writes nothing.
template <class Source>
__global__ void attend_kernel(const float* __restrict__ q, Source src, int key_a_dim, int rope, int out_dim,
                              float scale, float* __restrict__ o, float* __restrict__ lse,
                              float* __restrict__ part_acc, float* __restrict__ part_ml) {
  extern __shared__ float smem[];
  float* q_s = smem;                         // [key_a_dim + rope]
  float* score = smem + key_a_dim + rope;    // [kChunk]
  __shared__ float red[kWarps];
  const int t = blockIdx.x, h = blockIdx.y, num_heads = gridDim.y;
  const int split = blockIdx.z, n_splits = gridDim.z;
  const int visible = src.bind(t);
  if (visible <= 0) return;  // the whole block leaves together
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q_dim = key_a_dim + rope;
  const float* qt = q + (static_cast<int64_t>(t) * num_heads + h) * q_dim;
  for (int d = threadIdx.x; d < q_dim; d += kThreads) q_s[d] = qt[d];
  __syncthreads();

  const int first = src.begin();
  const int span = (visible - first + n_splits - 1) / n_splits;
  const int begin = first + split * span, end = min(visible, begin + span);
  float m = -INFINITY, l = 0;
  float acc[kMaxOutPerThread];
  for (int k = 0; k < kMaxOutPerThread; ++k) acc[k] = 0;

  for (int c0 = begin; c0 < end; c0 += kChunk) {
    const int n = min(kChunk, end - c0);
    // Scores of the chunk: warp per position, lanes over the dims.
    for (int i = warp; i < n; i += kWarps) {
      const int p = c0 + i;
      const auto* ka = src.key_a(p, h);
      const auto* kb = src.key_b(p);
      float s = 0;
      for (int d = lane; d < key_a_dim; d += 32) s += q_s[d] * ld(ka + d);
      for (int d = lane; d < rope; d += 32) s += q_s[key_a_dim + d] * ld(kb + d);
      s = warp_sum(s);
      if (lane == 0) score[i] = s * scale;
    }
    __syncthreads();
    // Online softmax over chunks: rescale what came before by exp(m_old - m_new).
    float local_max = -INFINITY;
    for (int i = threadIdx.x; i < n; i += kThreads) local_max = fmaxf(local_max, score[i]);
    const float m_new = fmaxf(m, block_max(local_max, red));
    const float factor = expf(m - m_new);  // 0 on the first chunk (m = -inf)
    float local_sum = 0;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float e = expf(score[i] - m_new);
      score[i] = e;
      local_sum += e;
    }
    // block_sum's barriers also publish the exponentiated scores to every thread.
    l = l * factor + block_sum(local_sum, red);
    m = m_new;
    for (int k = 0; k < kMaxOutPerThread; ++k) {
      const int j = threadIdx.x + k * kThreads;
      if (j >= out_dim) break;
      float a = acc[k] * factor;
      for (int i = 0; i < n; ++i) a += score[i] * ld(src.value(c0 + i, h) + j);
      acc[k] = a;
    }
    __syncthreads();  // the next chunk overwrites score[]
  }
  const int64_t th = static_cast<int64_t>(t) * num_heads + h;
  if (n_splits == 1) {
    float* ot = o + th * out_dim;
    const float inv_l = 1.0f / l;
    for (int k = 0; k < kMaxOutPerThread; ++k) {
      const int j = threadIdx.x + k * kThreads;
      if (j < out_dim) ot[j] = acc[k] * inv_l;
    }
    if (lse && threadIdx.x == 0) lse[th] = m + logf(l);
    return;
  }
  const int64_t ts = th * n_splits + split;
  float* pa = part_acc + ts * out_dim;
  for (int k = 0; k < kMaxOutPerThread; ++k) {
    const int j = threadIdx.x + k * kThreads;
    if (j < out_dim) pa[j] = acc[k];
  }
  if (threadIdx.x == 0) {
    part_ml[ts * 2] = m;
    part_ml[ts * 2 + 1] = l;
  }
}

// grid (n_tokens, H): o = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, M = max_s m_s
// (split 0 is never empty, so M is finite and empty splits weigh e^-inf = 0).
template <class Source>
__global__ void combine_splits_kernel(Source src, const float* __restrict__ part_acc,
                                      const float* __restrict__ part_ml, int n_splits, int out_dim,
                                      float* __restrict__ o, float* __restrict__ lse) {
  __shared__ float split_weight[kMaxSplits];  // e^(m_s - M), each once (not once per output dim)
  if (src.bind(blockIdx.x) <= 0) return;
  const int64_t th = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
  const float* ml = part_ml + th * n_splits * 2;
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s) M = fmaxf(M, ml[2 * s]);
  if (static_cast<int>(threadIdx.x) < n_splits) split_weight[threadIdx.x] = expf(ml[2 * threadIdx.x] - M);
  __syncthreads();
  float denom = 0;
  for (int s = 0; s < n_splits; ++s) denom += split_weight[s] * ml[2 * s + 1];
  const float inv = 1.0f / denom;
  if (lse && threadIdx.x == 0) lse[th] = M + logf(denom);
  const float* acc = part_acc + th * n_splits * out_dim;
  for (int j = threadIdx.x; j < out_dim; j += kThreads) {
    float a = 0;
#pragma unroll 8
    for (int s = 0; s < n_splits; ++s) a += split_weight[s] * acc[s * out_dim + j];
    o[th * out_dim + j] = a * inv;
  }
}

template <class Source>
void launch_attend(const float* q, const Source& src, int n_tokens, int num_heads, int key_a_dim, int rope,
                   int out_dim, float scale, int n_splits, float* o, float* lse, float* partials,
                   cudaStream_t stream) {
  MR_CHECK_LE(out_dim, kThreads * kMaxOutPerThread) << "MLA attention output width";
  if (n_tokens <= 0) return;
  const size_t smem = static_cast<size_t>(key_a_dim + rope + kChunk) * sizeof(float);
  MR_CHECK_LE(smem, 48u * 1024) << "MLA query width";
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  if (n_splits > 1) {
    MR_CHECK(partials != nullptr) << "MLA attention partials";
    part_acc = partials;
    part_ml = partials + static_cast<size_t>(n_tokens) * num_heads * n_splits * out_dim;
  }
  attend_kernel<<<dim3(n_tokens, num_heads, n_splits), kThreads, smem, stream>>>(q, src, key_a_dim, rope, out_dim,
                                                                                 scale, o, lse, part_acc, part_ml);
  CUDA_CHECK_LAUNCH();
  if (n_splits > 1) {
    combine_splits_kernel<<<dim3(n_tokens, num_heads), kThreads, 0, stream>>>(src, part_acc, part_ml, n_splits,
                                                                             out_dim, o, lse);
    CUDA_CHECK_LAUNCH();
  }
}

// Block (t, h) of a query-absorption kernel: its query row qt and output row dst, q_nope
// staged in shared memory; false (the block leaves) for a token this call does not compute.
__device__ __forceinline__ bool stage_query(const float* q, float* q_abs, int kv_lora, int nope, int rope,
                                            const BatchTables& batch, bool only_short_seqs, float* q_nope,
                                            const float*& qt, float*& dst) {
  const int t = blockIdx.x, h = blockIdx.y, num_heads = gridDim.y;
  if (!computes(batch, t, only_short_seqs)) return false;  // uniform over the block
  qt = q + (static_cast<int64_t>(t) * num_heads + h) * (nope + rope);
  dst = q_abs + (static_cast<int64_t>(t) * num_heads + h) * (kv_lora + rope);
  for (int n = threadIdx.x; n < nope; n += kThreads) q_nope[n] = qt[n];
  __syncthreads();
  return true;
}

// grid (n_tokens, H); dynamic shared memory nope floats.
// q_abs[t, h, l] = sum_n q_nope[t, h, n] * W_uk_h[n, l];  q_abs[t, h, kv_lora + d] = q_pe[t, h, d].
template <typename W>
__global__ void absorb_query_kernel(const float* __restrict__ q, const W* __restrict__ kv_b, int kv_lora, int nope,
                                    int rope, int v_dim, BatchTables batch, bool only_short_seqs,
                                    float* __restrict__ q_abs) {
  extern __shared__ float q_nope[];  // [nope]
  const int h = blockIdx.y;
  const float* qt;
  float* dst;
  if (!stage_query(q, q_abs, kv_lora, nope, rope, batch, only_short_seqs, q_nope, qt, dst)) return;
  const W* W_uk = kv_b + static_cast<int64_t>(h) * (nope + v_dim) * kv_lora;  // [nope, kv_lora]
  for (int l = threadIdx.x; l < kv_lora; l += kThreads) {
    float s = 0;
    for (int n = 0; n < nope; ++n) s += q_nope[n] * ld(W_uk + static_cast<int64_t>(n) * kv_lora + l);
    dst[l] = s;
  }
  for (int d = threadIdx.x; d < rope; d += kThreads) dst[kv_lora + d] = qt[nope + d];
}

// grid (n_tokens, H); dynamic shared memory kv_lora floats. o[t, h, j] = W_uv_h[j, :] . o_lat[t, h, :].
template <typename W>
__global__ void expand_output_kernel(const float* __restrict__ o_lat, const W* __restrict__ kv_b, int kv_lora,
                                     int nope, int v_dim, BatchTables batch, bool only_short_seqs,
                                     float* __restrict__ o) {
  extern __shared__ float lat[];  // [kv_lora]
  const int t = blockIdx.x, h = blockIdx.y, num_heads = gridDim.y;
  if (!computes(batch, t, only_short_seqs)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* src = o_lat + (static_cast<int64_t>(t) * num_heads + h) * kv_lora;
  for (int i = threadIdx.x; i < kv_lora; i += kThreads) lat[i] = src[i];
  __syncthreads();
  const W* W_uv = kv_b + (static_cast<int64_t>(h) * (nope + v_dim) + nope) * kv_lora;  // [v, kv_lora]
  float* ot = o + (static_cast<int64_t>(t) * num_heads + h) * v_dim;
  for (int j = warp; j < v_dim; j += kWarps) {
    const W* wr = W_uv + static_cast<int64_t>(j) * kv_lora;
    float s = 0;
    for (int i = lane; i < kv_lora; i += 32) s += ld(wr + i) * lat[i];
    s = warp_sum(s);
    if (lane == 0) ot[j] = s;
  }
}

// The two kernels above for bf16 kv_b, 8 weights a 16-byte load: one (token, head) pair
// reads 128 KiB of W_uk or W_uv, and two-byte loads, one dependent chain of 128 (absorb) or
// 16 (expand) a thread, made each 30-36 us at K3's width on an H200 whatever the batch.
// absorb: thread (g, c) of (kThreads / (kv_lora / 8)) x kv_lora / 8 takes columns 8c .. 8c + 7
// over rows n = g, g + groups, ... (K3: 4 groups); the groups' partial sums meet in shared
// memory (kThreads x 8 floats).

__device__ __forceinline__ void fma_bf16x8(uint4 w, float s, float acc[8]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc[2 * i] += s * bf16_lo(words[i]);
    acc[2 * i + 1] += s * bf16_hi(words[i]);
  }
}

__global__ void absorb_query_vec_kernel(const float* __restrict__ q, const bf16* __restrict__ kv_b, int kv_lora,
                                        int nope, int rope, int v_dim, BatchTables batch, bool only_short_seqs,
                                        float* __restrict__ q_abs) {
  extern __shared__ float absorb_smem[];  // q_nope [nope], then partial sums [groups][kv_lora]
  float* q_nope = absorb_smem;
  float* partial = absorb_smem + nope;
  const int h = blockIdx.y;
  const float* qt;
  float* dst;
  if (!stage_query(q, q_abs, kv_lora, nope, rope, batch, only_short_seqs, q_nope, qt, dst)) return;
  const int cols = kv_lora / 8, groups = kThreads / cols, c = threadIdx.x % cols, g = threadIdx.x / cols;
  const uint4* W_uk = reinterpret_cast<const uint4*>(kv_b + static_cast<int64_t>(h) * (nope + v_dim) * kv_lora);
  float acc[8] = {};
#pragma unroll 8
  for (int n = g; n < nope; n += groups) fma_bf16x8(W_uk[static_cast<int64_t>(n) * cols + c], q_nope[n], acc);
#pragma unroll
  for (int i = 0; i < 8; ++i) partial[g * kv_lora + 8 * c + i] = acc[i];
  __syncthreads();
  for (int l = threadIdx.x; l < kv_lora; l += kThreads) {
    float sum = 0;
    for (int gg = 0; gg < groups; ++gg) sum += partial[gg * kv_lora + l];
    dst[l] = sum;
  }
  for (int d = threadIdx.x; d < rope; d += kThreads) dst[kv_lora + d] = qt[nope + d];
}

// expand: warp w takes output rows w, w + kWarps, ..., four at a time; lane l the 8-wide
// column chunks l, l + 32, ... of each.
__global__ void expand_output_vec_kernel(const float* __restrict__ o_lat, const bf16* __restrict__ kv_b, int kv_lora,
                                         int nope, int v_dim, BatchTables batch, bool only_short_seqs,
                                         float* __restrict__ o) {
  extern __shared__ float lat[];  // [kv_lora]
  const int t = blockIdx.x, h = blockIdx.y, num_heads = gridDim.y;
  if (!computes(batch, t, only_short_seqs)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, cols = kv_lora / 8;
  const float* src = o_lat + (static_cast<int64_t>(t) * num_heads + h) * kv_lora;
  for (int i = threadIdx.x; i < kv_lora; i += kThreads) lat[i] = src[i];
  __syncthreads();
  const uint4* W_uv = reinterpret_cast<const uint4*>(kv_b + (static_cast<int64_t>(h) * (nope + v_dim) + nope) * kv_lora);
  float* ot = o + (static_cast<int64_t>(t) * num_heads + h) * v_dim;
  constexpr int kRowsAtOnce = 4;
  for (int j0 = warp * kRowsAtOnce; j0 < v_dim; j0 += kWarps * kRowsAtOnce) {
    float s[kRowsAtOnce] = {};
    for (int c = lane; c < cols; c += 32) {
      const float4 x0 = *reinterpret_cast<const float4*>(lat + 8 * c), x1 = *reinterpret_cast<const float4*>(lat + 8 * c + 4);
      const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int r = 0; r < kRowsAtOnce; ++r) {
        if (j0 + r >= v_dim) continue;
        const uint4 w = W_uv[static_cast<int64_t>(j0 + r) * cols + c];
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
          s[r] += bf16_lo(words[i]) * x[2 * i] + bf16_hi(words[i]) * x[2 * i + 1];
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsAtOnce; ++r) {
      const float sum = warp_sum(s[r]);
      if (lane == 0 && j0 + r < v_dim) ot[j0 + r] = sum;
    }
  }
}

// Where the vectorised kernels apply: bf16 kv_b on 16-byte rows, and for absorb a whole
// number of row groups in the block (8 kv_lora / 8 divides kThreads).
bool vec_kv_b_applies(const KvB& kv_b, const MlaShape& shape) {
  const int cols = shape.kv_lora / 8;
  return kv_b.bf16 && shape.kv_lora % 8 == 0 && reinterpret_cast<uintptr_t>(kv_b.w) % 16 == 0 && cols > 0 &&
         kThreads % cols == 0;
}

// ---- decode over all heads of a group at once -------------------------------------------
// The absorbed key and value are the same cache row for every head, so the kernel above,
// which runs one block per (token, head), reads each row num_heads times (96 in K3: at
// batch 128 over 4k positions that is 58 GB a layer). This one runs one block per (token,
// group of 16 heads, split) and stages each chunk of 32 rows in shared memory once for the
// 16 heads: scores for 16 x 32 (head, position) pairs, an online softmax per head, and the
// 16 x kv_lora accumulators, all fp32 as above. For bf16 caches with num_heads % 16 == 0.
constexpr int kGroupHeads = 16;
constexpr int kGroupChunk = 32;
constexpr int kMaxLatent = 512;  // accumulators per thread: 4 heads x 8 dims; 64 x 8 = 512 dims

__host__ __device__ inline int group_row_stride(int row_width) { return row_width + 2; }  // bf16, +4 B: banks

size_t group_smem_bytes(int row_width) {
  return static_cast<size_t>(kGroupHeads) * row_width * sizeof(float) +                 // q
         static_cast<size_t>(kGroupChunk) * group_row_stride(row_width) * sizeof(bf16) +  // rows
         static_cast<size_t>(kGroupHeads) * kGroupChunk * sizeof(float) +                 // p
         3 * kGroupHeads * sizeof(float);                                                 // m, l, factor
}

// grid (n_tokens, num_heads / 16, n_splits), kThreads threads.
__global__ void __launch_bounds__(kThreads) attend_group_kernel(const float* __restrict__ q_abs,
                                                                AbsorbedSource<bf16> src, int kv_lora, int rope,
                                                                float scale, float* __restrict__ o,
                                                                float* __restrict__ part_acc,
                                                                float* __restrict__ part_ml) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int row_width = kv_lora + rope, stride = group_row_stride(row_width);
  float* q_s = reinterpret_cast<float*>(smem_raw);                          // [16][row_width]
  bf16* rows = reinterpret_cast<bf16*>(q_s + kGroupHeads * row_width);      // [32][stride]
  float* p_s = reinterpret_cast<float*>(rows + kGroupChunk * stride);       // [16][32]
  float* m_s = p_s + kGroupHeads * kGroupChunk;                             // [16]
  float* l_s = m_s + kGroupHeads;                                           // [16]
  float* f_s = l_s + kGroupHeads;                                           // [16]
  const int t = blockIdx.x, h0 = blockIdx.y * kGroupHeads, num_heads = gridDim.y * kGroupHeads;
  const int split = blockIdx.z, n_splits = gridDim.z;
  const int visible = src.bind(t);
  if (visible <= 0) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < kGroupHeads * row_width; i += kThreads)
    q_s[i] = q_abs[(static_cast<int64_t>(t) * num_heads + h0) * row_width + i];
  if (tid < kGroupHeads) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0;
  }
  const int span = (visible + n_splits - 1) / n_splits;
  const int begin = split * span, end = min(visible, begin + span);
  // Value accumulators: heads ah0 .. ah0 + 3, latent dims j0 .. j0 + 7.
  const int ah0 = (tid / 64) * 4, j0 = (tid % 64) * 8;
  const bool owns_dims = j0 < kv_lora;
  float acc[4][8];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[a][j] = 0;
  // Scores: head sh, positions sp and sp + 16.
  const int sh = tid / 16, sp = tid % 16;
  const int pieces = row_width / 8;  // 16-byte pieces per row

  for (int c0 = begin; c0 < end; c0 += kGroupChunk) {
    const int n = min(kGroupChunk, end - c0);
    __syncthreads();  // the previous chunk's rows and p are read
    for (int i = tid; i < kGroupChunk * pieces; i += kThreads) {
      const int r = i / pieces, piece = i % pieces;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < n) v = *reinterpret_cast<const uint4*>(src.key_a(c0 + r, 0) + piece * 8);
      // The padded stride is 4-byte aligned only: store as words.
      uint32_t* dst = reinterpret_cast<uint32_t*>(rows + r * stride + piece * 8);
      dst[0] = v.x;
      dst[1] = v.y;
      dst[2] = v.z;
      dst[3] = v.w;
    }
    __syncthreads();
    {
      const float* qh = q_s + sh * row_width;
      const __nv_bfloat162* ka = reinterpret_cast<const __nv_bfloat162*>(rows + sp * stride);
      const __nv_bfloat162* kb = reinterpret_cast<const __nv_bfloat162*>(rows + (sp + 16) * stride);
      float s0 = 0, s1 = 0;
      for (int d = 0; d < row_width / 2; ++d) {
        const float2 qq = *reinterpret_cast<const float2*>(qh + 2 * d);
        const float2 x0 = __bfloat1622float2(ka[d]), x1 = __bfloat1622float2(kb[d]);
        s0 = fmaf(qq.x, x0.x, fmaf(qq.y, x0.y, s0));
        s1 = fmaf(qq.x, x1.x, fmaf(qq.y, x1.y, s1));
      }
      p_s[sh * kGroupChunk + sp] = sp < n ? s0 * scale : -INFINITY;
      p_s[sh * kGroupChunk + sp + 16] = sp + 16 < n ? s1 * scale : -INFINITY;
    }
    __syncthreads();
    // Online softmax per head: warp w takes heads 2w and 2w + 1, a lane per position.
    for (int hh = 2 * warp; hh < 2 * warp + 2; ++hh) {
      const float sc = p_s[hh * kGroupChunk + lane];
      const float m_old = m_s[hh], l_old = l_s[hh];
      const float m_new = fmaxf(m_old, warp_max(sc));
      const float e = expf(sc - m_new);  // 0 for the positions past n
      const float sum = warp_sum(e);
      p_s[hh * kGroupChunk + lane] = e;
      __syncwarp();  // every lane has read m_s / l_s before lane 0 rewrites them
      if (lane == 0) {
        const float factor = expf(m_old - m_new);  // 0 on the first chunk
        f_s[hh] = factor;
        l_s[hh] = l_old * factor + sum;
        m_s[hh] = m_new;
      }
    }
    __syncthreads();
    if (owns_dims) {
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const float f = f_s[ah0 + a];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[a][j] *= f;
      }
      for (int r = 0; r < n; ++r) {
        const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(rows + r * stride + j0);
        float vv[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 x = __bfloat1622float2(v[j]);
          vv[2 * j] = x.x;
          vv[2 * j + 1] = x.y;
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          const float p = p_s[(ah0 + a) * kGroupChunk + r];
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[a][j] = fmaf(p, vv[j], acc[a][j]);
        }
      }
    }
  }
  __syncthreads();  // the last chunk's m, l are written
  if (!owns_dims) return;
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int h = h0 + ah0 + a;
    const int64_t th = static_cast<int64_t>(t) * num_heads + h;
    if (n_splits == 1) {
      const float inv_l = 1.0f / l_s[ah0 + a];
      float* ot = o + th * kv_lora + j0;
#pragma unroll
      for (int j = 0; j < 8; ++j) ot[j] = acc[a][j] * inv_l;
    } else {
      const int64_t ts = th * n_splits + split;
      float* pa = part_acc + ts * kv_lora + j0;
#pragma unroll
      for (int j = 0; j < 8; ++j) pa[j] = acc[a][j];
      if (j0 == 0) {
        part_ml[ts * 2] = m_s[ah0 + a];
        part_ml[ts * 2 + 1] = l_s[ah0 + a];
      }
    }
  }
}

// For a bf16 cache (its only caller's branch).
bool group_kernel_applies(int num_heads, int kv_lora, int rope) {
  return num_heads % kGroupHeads == 0 && kv_lora % 8 == 0 && kv_lora <= kMaxLatent &&
         (kv_lora + rope) % 8 == 0 && group_smem_bytes(kv_lora + rope) <= 200 * 1024;
}

// ---- the same on the tensor cores ------------------------------------------------------
// With a bf16 or fp8 cache (fp8 rows widened to bf16 as they come into shared memory: exact)
// the grouped decode runs its two products on mma.sync.m16n8k16: the 16
// heads are the M side. Per chunk of 64 cached rows (staged once in shared memory): S =
// Q_abs K^T (warp w takes keys 8w .. 8w + 7 over the 576-wide rows), an online softmax per
// head in fp32 (warp w: heads 2w, 2w + 1), then O += P V with V the rows' first kv_lora
// values (warp w: latent dims 64w .. 64w + 63), B fragments loaded transposed by ldmatrix.
// Q and P are rounded to bf16 for the MMAs (as FlashMLA does); scores, softmax and
// accumulators stay fp32. For kv_lora % 64 == 0 (<= 512) and (kv_lora + rope) % 16 == 0.
constexpr int kMmaChunk = 64;

__host__ __device__ inline int mma_row_stride(int row_width) { return row_width + 8; }  // bf16: +16 B

constexpr int kRowPtrBytes = kMmaChunk * 8;  // the chunk's row addresses (16-byte multiple)

size_t group_mma_smem_bytes(int row_width) {
  const int st = mma_row_stride(row_width);
  return kRowPtrBytes +                                                    // row addresses
         static_cast<size_t>(kMmaChunk) * st * sizeof(bf16) +              // rows
         static_cast<size_t>(kGroupHeads) * st * sizeof(bf16) +            // q
         static_cast<size_t>(kGroupHeads) * kMmaChunk * sizeof(float) +    // scores
         static_cast<size_t>(kGroupHeads) * (kMmaChunk + 8) * sizeof(bf16) +  // P
         3 * kGroupHeads * sizeof(float);
}

// An fp8 chunk comes through registers (16 values a load, widened to bf16 on the way into
// shared memory): at most this many loads a thread, so rows up to 12 x 256 x 16 B / 64 = 768.
constexpr int kFp8LoadsPerThread = 12;
constexpr int kFp8Batch = 6;

// 16 e4m3 values -> 16 bf16 (exact: every e4m3 value is a bf16 value), by the hardware's
// e4m3x2 -> f16x2 conversion, then f16 -> f32 -> bf16 (both exact).
__device__ __forceinline__ void widen_fp8x16(const uint4 v, bf16* dst) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2)));
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(out[0], out[1], out[2], out[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// grid (n_tokens, num_heads / 16, n_splits), kThreads threads. Source: AbsorbedSource or
// SparseSource over bf16 or fp8 rows (a position j of the source is its key_a(j) row).
template <class Source>
__global__ void __launch_bounds__(kThreads) attend_group_mma_kernel(const float* __restrict__ q_abs,
                                                                    Source src, int kv_lora, int rope,
                                                                    float scale, float* __restrict__ o,
                                                                    float* __restrict__ part_acc,
                                                                    float* __restrict__ part_ml) {
  using Cache = typename Source::CacheType;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int row_width = kv_lora + rope, st = mma_row_stride(row_width);
  const Cache** row_ptr = reinterpret_cast<const Cache**>(smem_raw);     // [64]
  bf16* rows = reinterpret_cast<bf16*>(smem_raw + kRowPtrBytes);          // [64][st]
  bf16* q_s = rows + kMmaChunk * st;                                      // [16][st]
  float* s_s = reinterpret_cast<float*>(q_s + kGroupHeads * st);          // [16][64]
  bf16* p_s = reinterpret_cast<bf16*>(s_s + kGroupHeads * kMmaChunk);     // [16][72]
  float* m_s = reinterpret_cast<float*>(p_s + kGroupHeads * (kMmaChunk + 8));
  float* l_s = m_s + kGroupHeads;
  float* f_s = l_s + kGroupHeads;
  constexpr int ps = kMmaChunk + 8;
  const int t = blockIdx.x, h0 = blockIdx.y * kGroupHeads, num_heads = gridDim.y * kGroupHeads;
  const int split = blockIdx.z, n_splits = gridDim.z;
  const int visible = src.bind(t);
  if (visible <= 0) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  for (int i = tid; i < kGroupHeads * row_width; i += kThreads) {
    const int hh = i / row_width, d = i % row_width;
    q_s[hh * st + d] = __float2bfloat16_rn(q_abs[(static_cast<int64_t>(t) * num_heads + h0) * row_width + i]);
  }
  if (tid < kGroupHeads) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0;
  }
  const int span = (visible + n_splits - 1) / n_splits;
  const int begin = split * span, end = min(visible, begin + span);
  const int n_vf = kv_lora / 64;  // n8 fragments of O per warp (8 at kv_lora 512)
  const int d0 = warp * 8 * n_vf;  // this warp's first latent dim
  float acc[8][4];
#pragma unroll
  for (int u = 0; u < 8; ++u) acc[u][0] = acc[u][1] = acc[u][2] = acc[u][3] = 0;

  for (int c0 = begin; c0 < end; c0 += kMmaChunk) {
    const int n = min(kMmaChunk, end - c0);
    __syncthreads();  // the previous chunk is read (the first time: q_s, m_s, l_s written)
    // The chunk's rows: their addresses first (one page-table read each, all at once), then
    // every 16-byte piece as a cp.async. (Loading through registers waited out the page-table
    // read and the row read of each piece in turn: ~20 us a chunk, 0.35 ms a layer at b=8.)
    if (tid < kMmaChunk) row_ptr[tid] = tid < n ? src.key_a(c0 + tid, 0) : nullptr;
    __syncthreads();
    if constexpr (std::is_same_v<Cache, bf16>) {
      const int pieces = row_width / 8;
      for (int i = tid; i < kMmaChunk * pieces; i += kThreads) {
        const int r = i / pieces, piece = i % pieces;
        bf16* dst = rows + r * st + piece * 8;
        if (r < n) cp_async16(dst, row_ptr[r] + piece * 8);
        else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
      cp_async_wait_all();
    } else {
      // fp8: the chunk's loads in batches of kFp8Batch, each batch issued before any of it
      // is widened into its bf16 row (a batch of 12 held 184 registers: one block an SM).
      const int pieces16 = row_width / 16;
      for (int k0 = 0; k0 < kFp8LoadsPerThread && (tid + k0 * kThreads) < kMmaChunk * pieces16; k0 += kFp8Batch) {
        uint4 v[kFp8Batch];
#pragma unroll
        for (int k = 0; k < kFp8Batch; ++k) {
          const int i = tid + (k0 + k) * kThreads, r = i / pieces16;
          v[k] = make_uint4(0, 0, 0, 0);
          if (i < kMmaChunk * pieces16 && r < n)
            v[k] = *reinterpret_cast<const uint4*>(row_ptr[r] + (i % pieces16) * 16);
        }
#pragma unroll
        for (int k = 0; k < kFp8Batch; ++k) {
          const int i = tid + (k0 + k) * kThreads;
          if (i < kMmaChunk * pieces16) widen_fp8x16(v[k], rows + (i / pieces16) * st + (i % pieces16) * 16);
        }
      }
    }
    __syncthreads();
    // S[16 heads][keys 8w .. 8w + 7] = Q K^T over row_width.
    {
      float c[4] = {0, 0, 0, 0};
      const bf16* qa = q_s + g * st;
      const bf16* qb = qa + 8 * st;
      const bf16* kr = rows + (8 * warp + g) * st;
      for (int kk = 0; kk < row_width; kk += 16) {
        mma_m16n8k16_bf16(c, bf16_pair(qa + kk + 2 * tq), bf16_pair(qb + kk + 2 * tq), bf16_pair(qa + kk + 2 * tq + 8),
                 bf16_pair(qb + kk + 2 * tq + 8), bf16_pair(kr + kk + 2 * tq), bf16_pair(kr + kk + 2 * tq + 8));
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = 8 * warp + 2 * tq + j;
        s_s[g * kMmaChunk + key] = key < n ? c[j] * scale : -INFINITY;
        s_s[(g + 8) * kMmaChunk + key] = key < n ? c[2 + j] * scale : -INFINITY;
      }
    }
    __syncthreads();
    // Online softmax: warp w takes heads 2w, 2w + 1; lane takes keys lane, lane + 32.
    for (int hh = 2 * warp; hh < 2 * warp + 2; ++hh) {
      const float s0 = s_s[hh * kMmaChunk + lane], s1 = s_s[hh * kMmaChunk + lane + 32];
      const float m_old = m_s[hh], l_old = l_s[hh];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
      const float e0 = expf(s0 - m_new), e1 = expf(s1 - m_new);  // 0 past n
      const float sum = warp_sum(e0 + e1);
      p_s[hh * ps + lane] = __float2bfloat16_rn(e0);
      p_s[hh * ps + lane + 32] = __float2bfloat16_rn(e1);
      __syncwarp();
      if (lane == 0) {
        const float factor = expf(m_old - m_new);  // 0 on the first chunk
        f_s[hh] = factor;
        l_s[hh] = l_old * factor + sum;
        m_s[hh] = m_new;
      }
    }
    __syncthreads();
    // O[16][d0 .. d0 + 8 n_vf) = O * factor + P V.
    const float fa = f_s[g], fb = f_s[g + 8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      acc[u][0] *= fa;
      acc[u][1] *= fa;
      acc[u][2] *= fb;
      acc[u][3] *= fb;
    }
    const bf16* pa = p_s + g * ps;
    const bf16* pb = pa + 8 * ps;
#pragma unroll
    for (int ks = 0; ks < kMmaChunk / 16; ++ks) {
      const int k0 = 16 * ks;
      const uint32_t a0 = bf16_pair(pa + k0 + 2 * tq), a1 = bf16_pair(pb + k0 + 2 * tq);
      const uint32_t a2 = bf16_pair(pa + k0 + 2 * tq + 8), a3 = bf16_pair(pb + k0 + 2 * tq + 8);
      // B = V[k0 .. k0 + 15][dims] (row-major [key][dim]): ldmatrix .trans, lanes 0-15 give
      // the addresses of keys k0 + lane (lanes 16-31 repeat them; x2 reads lanes 0-15).
      const bf16* vrow = rows + (k0 + (lane % 16)) * st;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (u >= n_vf) break;
        const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(vrow + d0 + 8 * u));
        uint32_t b0, b1;
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(b0), "=r"(b1)
                     : "r"(addr));
        mma_m16n8k16_bf16(acc[u], a0, a1, a2, a3, b0, b1);
      }
    }
  }
  __syncthreads();  // the last chunk's m, l are written
  // C fragment: heads g / g + 8, dims d0 + 8u + 2tq (+1).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int hh = g + 8 * half;
    const int64_t th = static_cast<int64_t>(t) * num_heads + h0 + hh;
    const float inv_l = 1.0f / l_s[hh];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      if (u >= n_vf) break;
      const int d = d0 + 8 * u + 2 * tq;
      if (n_splits == 1) {
        o[th * kv_lora + d] = acc[u][2 * half] * inv_l;
        o[th * kv_lora + d + 1] = acc[u][2 * half + 1] * inv_l;
      } else {
        const int64_t ts = th * n_splits + split;
        part_acc[ts * kv_lora + d] = acc[u][2 * half];
        part_acc[ts * kv_lora + d + 1] = acc[u][2 * half + 1];
        if (warp == 0 && tq == 0 && u == 0) {
          part_ml[ts * 2] = m_s[hh];
          part_ml[ts * 2 + 1] = l_s[hh];
        }
      }
    }
  }
}

template <typename Cache>
bool group_mma_applies(int num_heads, int kv_lora, int rope) {
  const int row = kv_lora + rope;
  const bool loads_fit = std::is_same_v<Cache, bf16> || row <= 16 * kThreads * kFp8LoadsPerThread / kMmaChunk;
  return num_heads % kGroupHeads == 0 && kv_lora % 64 == 0 && kv_lora <= 512 && row % 16 == 0 && loads_fit &&
         group_mma_smem_bytes(row) <= 200 * 1024;
}

float softmax_scale(int nope, int rope) { return 1.0f / std::sqrt(static_cast<float>(nope + rope)); }

int plain_splits(int n_tokens, int num_heads, int n_positions) {
  // Enough blocks to fill the GPU when there are few (token, head) pairs, each split still
  // kMinSplitPositions long; prefill-sized calls keep one split (no partials).
  const int by_blocks = std::max(1, kTargetBlocks / std::max(1, n_tokens * num_heads));
  const int by_positions = std::max(1, (n_positions + kMinSplitPositions - 1) / kMinSplitPositions);
  return std::min(by_blocks, by_positions);
}

int absorbed_splits(int n_tokens, int num_heads) {
  if (num_heads % kGroupHeads == 0) {
    // The grouped kernel: (token, head group) pairs, two blocks per SM of an H200's 132.
    const int pairs = std::max(1, n_tokens * (num_heads / kGroupHeads));
    return std::clamp((264 + pairs - 1) / pairs, 1, kMaxSplits);
  }
  return std::clamp(kTargetBlocks / std::max(1, n_tokens * num_heads), 1, kMaxSplits);
}

size_t partial_floats(int n_tokens, int num_heads, int n_splits, int out_dim) {
  return n_splits == 1 ? 0 : static_cast<size_t>(n_tokens) * num_heads * n_splits * (out_dim + 2);
}

// The splits' partials into o_lat, when the positions were split (combine_splits_kernel).
template <class Source>
void combine_if_split(const Source& src, int n_tokens, int num_heads, int n_splits, int kv_lora, float* part_acc,
                      float* part_ml, float* o_lat, cudaStream_t stream) {
  if (n_splits <= 1) return;
  combine_splits_kernel<<<dim3(n_tokens, num_heads), kThreads, 0, stream>>>(src, part_acc, part_ml, n_splits, kv_lora,
                                                                           o_lat, nullptr);
  CUDA_CHECK_LAUNCH();
}

// The grouped tensor-core kernel over src (16 heads a block, the positions in n_splits),
// then the combine: the absorbed decode's launch and the sparse one's.
template <class Source>
void launch_group_mma(const float* q_abs, const Source& src, int n_tokens, const MlaShape& shape, float scale,
                      int n_splits, float* partials, float* o_lat, cudaStream_t stream) {
  const int H = shape.num_heads;
  MR_CHECK(n_splits == 1 || partials != nullptr) << "MLA attention partials";
  float* part_acc = n_splits > 1 ? partials : nullptr;
  float* part_ml = n_splits > 1 ? partials + static_cast<size_t>(n_tokens) * H * n_splits * shape.kv_lora : nullptr;
  const size_t smem = group_mma_smem_bytes(shape.row_width());
  allow_dynamic_smem(attend_group_mma_kernel<Source>, smem);
  attend_group_mma_kernel<<<dim3(n_tokens, H / kGroupHeads, n_splits), kThreads, smem, stream>>>(
      q_abs, src, shape.kv_lora, shape.rope, scale, o_lat, part_acc, part_ml);
  CUDA_CHECK_LAUNCH();
  combine_if_split(src, n_tokens, H, n_splits, shape.kv_lora, part_acc, part_ml, o_lat, stream);
}

}  // namespace

size_t mla_plain_partial_floats(int n_tokens, int num_heads, int n_positions, int v_dim) {
  return partial_floats(n_tokens, num_heads, plain_splits(n_tokens, num_heads, n_positions), v_dim);
}

size_t mla_absorbed_partial_floats(int n_tokens, int num_heads, int kv_lora) {
  // Enough for whichever kernel mla_attend_absorbed picks.
  return std::max(partial_floats(n_tokens, num_heads, absorbed_splits(n_tokens, num_heads), kv_lora),
                  partial_floats(n_tokens, num_heads, mla_decode_heads_splits(n_tokens, num_heads), kv_lora));
}

void mla_attend_plain(const float* q, const float* kv, const KvLayer& cache, const int32_t* pages, int n_tokens,
                      int n_past, int key_begin, int n_keys, const MlaShape& shape, float* o, float* lse,
                      float* partials, cudaStream_t stream) {
  const int H = shape.num_heads, n_splits = plain_splits(n_tokens, H, n_keys);
  const float scale = softmax_scale(shape.nope, shape.rope);
  with_cache_type(cache.dtype, [&](auto tag) {
    using Cache = typename decltype(tag)::type;
    const PlainSource<Cache> src{kv,         paged_rows<Cache>(cache), pages,      n_past,   H, shape.kv_lora,
                                 shape.nope, shape.v_dim,              key_begin, key_begin + n_keys};
    launch_attend(q, src, n_tokens, H, shape.nope, shape.rope, shape.v_dim, scale, n_splits, o, lse, partials, stream);
  });
}

namespace {
// o, lse <- the softmax-weighted union of (o, lse) and (o_blk, lse_blk), one block per row.
__global__ void merge_blocks_kernel(float* __restrict__ o, float* __restrict__ lse, const float* __restrict__ o_blk,
                                    const float* __restrict__ lse_blk, int v_dim) {
  const int64_t row = blockIdx.x;
  const float a = lse[row], b = lse_blk[row], M = fmaxf(a, b);
  const float wa = expf(a - M), wb = expf(b - M), inv = 1.0f / (wa + wb);
  for (int j = threadIdx.x; j < v_dim; j += blockDim.x)
    o[row * v_dim + j] = (o[row * v_dim + j] * wa + o_blk[row * v_dim + j] * wb) * inv;
  __syncthreads();  // every thread has read lse[row]
  if (threadIdx.x == 0) lse[row] = M + logf(wa + wb);
}
}  // namespace

void mla_merge_blocks(float* o, float* lse, const float* o_blk, const float* lse_blk, int64_t rows, int v_dim,
                      cudaStream_t stream) {
  if (rows <= 0) return;
  merge_blocks_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(o, lse, o_blk, lse_blk, v_dim);
  CUDA_CHECK_LAUNCH();
}

void mla_absorb_query(const float* q, const KvB& kv_b, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                      bool only_short_seqs, float* q_abs, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const dim3 grid(n_tokens, shape.num_heads);
  if (vec_kv_b_applies(kv_b, shape)) {
    const size_t smem = (shape.nope + static_cast<size_t>(kThreads) * 8) * sizeof(float);
    absorb_query_vec_kernel<<<grid, kThreads, smem, stream>>>(q, static_cast<const bf16*>(kv_b.w), shape.kv_lora,
                                                              shape.nope, shape.rope, shape.v_dim, batch,
                                                              only_short_seqs, q_abs);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t smem = shape.nope * sizeof(float);
  if (kv_b.bf16)
    absorb_query_kernel<<<grid, kThreads, smem, stream>>>(q, static_cast<const bf16*>(kv_b.w), shape.kv_lora,
                                                          shape.nope, shape.rope, shape.v_dim, batch,
                                                          only_short_seqs, q_abs);
  else
    absorb_query_kernel<<<grid, kThreads, smem, stream>>>(q, static_cast<const float*>(kv_b.w), shape.kv_lora,
                                                          shape.nope, shape.rope, shape.v_dim, batch,
                                                          only_short_seqs, q_abs);
  CUDA_CHECK_LAUNCH();
}

void mla_attend_absorbed(const float* q_abs, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                         const KvLayer& cache, bool only_short_seqs, bool bf16_math, float* o_lat,
                         float* partials, cudaStream_t stream) {
  if (mla_decode_heads_applies(shape, cache.dtype)) {
    mla_decode_heads(q_abs, n_tokens, shape, batch, cache, only_short_seqs, o_lat, partials, stream);
    return;
  }
  const int H = shape.num_heads, n_splits = absorbed_splits(n_tokens, H);
  const float scale = softmax_scale(shape.nope, shape.rope);
  // The grouped kernels (16 heads a block): on the tensor cores where they apply (bf16 or
  // fp8 caches), else on CUDA cores (bf16); both leave partials for combine_splits_kernel
  // when the positions are split. Otherwise one block per (token, head).
  with_cache_type(cache.dtype, [&](auto tag) {
    using Cache = typename decltype(tag)::type;
    const AbsorbedSource<Cache> src{paged_rows<Cache>(cache), batch, only_short_seqs, shape.kv_lora};
    bool grouped = false;
    if constexpr (!std::is_same_v<Cache, float>) {
      const bool mma = (std::is_same_v<Cache, bf16> || bf16_math) && group_mma_applies<Cache>(H, shape.kv_lora, shape.rope);
      if constexpr (std::is_same_v<Cache, bf16>)
        grouped = mma || group_kernel_applies(H, shape.kv_lora, shape.rope);
      else
        grouped = mma;
      if (n_tokens > 0 && grouped) {
        if (mma) {
          launch_group_mma(q_abs, src, n_tokens, shape, scale, n_splits, partials, o_lat, stream);
        } else if constexpr (std::is_same_v<Cache, bf16>) {
          float* part_acc = n_splits > 1 ? partials : nullptr;
          float* part_ml =
              n_splits > 1 ? partials + static_cast<size_t>(n_tokens) * H * n_splits * shape.kv_lora : nullptr;
          const size_t smem = group_smem_bytes(shape.row_width());
          allow_dynamic_smem(attend_group_kernel, smem);
          attend_group_kernel<<<dim3(n_tokens, H / kGroupHeads, n_splits), kThreads, smem, stream>>>(
              q_abs, src, shape.kv_lora, shape.rope, scale, o_lat, part_acc, part_ml);
          CUDA_CHECK_LAUNCH();
          combine_if_split(src, n_tokens, H, n_splits, shape.kv_lora, part_acc, part_ml, o_lat, stream);
        }
        return;
      }
    }
    launch_attend(q_abs, src, n_tokens, H, shape.kv_lora, shape.rope, shape.kv_lora, scale, n_splits, o_lat, nullptr,
                  partials, stream);
  });
}

namespace {

// The splits of the tensor-core sparse path: as the grouped decode's, but never more than
// the selection has 64-row chunks (k = 2,048: at most 32).
int sparse_splits(int n_tokens, int num_heads, int k) {
  return std::clamp(absorbed_splits(n_tokens, num_heads), 1, std::max(1, (k + kMmaChunk - 1) / kMmaChunk));
}

bool sparse_mma_applies(const MlaShape& shape, DType cache_dtype, bool bf16_math) {
  if (!dsa_fast()) return false;
  if (cache_dtype == DType::BF16) return group_mma_applies<bf16>(shape.num_heads, shape.kv_lora, shape.rope);
  if (cache_dtype == DType::F8_E4M3)
    return bf16_math && group_mma_applies<fp8>(shape.num_heads, shape.kv_lora, shape.rope);
  return false;
}

}  // namespace

size_t mla_sparse_partial_floats(int n_tokens, int num_heads, int kv_lora, int k) {
  // Enough for whichever kernel mla_attend_sparse picks.
  return std::max(partial_floats(n_tokens, num_heads, sparse_splits(n_tokens, num_heads, k), kv_lora),
                  partial_floats(n_tokens, num_heads, mla_decode_heads_splits(n_tokens, num_heads), kv_lora));
}

void mla_attend_sparse(const float* q_abs, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                       const KvLayer& cache, const int32_t* selected, int k, bool bf16_math, float* o_lat,
                       float* partials, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const float scale = softmax_scale(shape.nope, shape.rope);
  const int H = shape.num_heads;
  with_cache_type(cache.dtype, [&](auto tag) {
    using Cache = typename decltype(tag)::type;
    const SparseSource<Cache> src{paged_rows<Cache>(cache), batch, selected, k, shape.kv_lora};
    if constexpr (!std::is_same_v<Cache, float>) {
      if (dsa_fast() && std::is_same_v<Cache, bf16> && mla_decode_heads_applies(shape, cache.dtype)) {
        // bf16 rows of K3's width on sm_90a: every head of a token in one block (up to 48) on
        // the warpgroup MMAs, so a selected row is read once a token (twice at 96 heads), not
        // once per 16 heads; the selection split over the SMs and combined after.
        mla_decode_heads(q_abs, n_tokens, shape, batch, cache, /*only_short_seqs=*/false, o_lat, partials, stream,
                         selected, k);
        return;
      }
      if (sparse_mma_applies(shape, cache.dtype, bf16_math)) {
        // 16 heads a block on the tensor cores, the selection split over the SMs (decode)
        // and the splits combined after, as the grouped absorbed decode does.
        launch_group_mma(q_abs, src, n_tokens, shape, scale, sparse_splits(n_tokens, H, k), partials, o_lat, stream);
        return;
      }
    }
    // The reference: one split, one block per (token, head), CUDA cores.
    launch_attend(q_abs, src, n_tokens, H, shape.kv_lora, shape.rope, shape.kv_lora, scale, 1, o_lat, nullptr,
                  nullptr, stream);
  });
}

void mla_expand_output(const float* o_lat, const KvB& kv_b, int n_tokens, const MlaShape& shape,
                       const BatchTables& batch, bool only_short_seqs, float* o, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const dim3 grid(n_tokens, shape.num_heads);
  const size_t smem = shape.kv_lora * sizeof(float);
  if (vec_kv_b_applies(kv_b, shape)) {
    expand_output_vec_kernel<<<grid, kThreads, smem, stream>>>(o_lat, static_cast<const bf16*>(kv_b.w), shape.kv_lora,
                                                               shape.nope, shape.v_dim, batch, only_short_seqs, o);
    CUDA_CHECK_LAUNCH();
    return;
  }
  if (kv_b.bf16)
    expand_output_kernel<<<grid, kThreads, smem, stream>>>(o_lat, static_cast<const bf16*>(kv_b.w), shape.kv_lora,
                                                           shape.nope, shape.v_dim, batch, only_short_seqs, o);
  else
    expand_output_kernel<<<grid, kThreads, smem, stream>>>(o_lat, static_cast<const float*>(kv_b.w), shape.kv_lora,
                                                           shape.nope, shape.v_dim, batch, only_short_seqs, o);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
