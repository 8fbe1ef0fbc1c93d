// Absorbed MLA decode over many heads at once (flash-decoding) on Hopper's warpgroup MMAs
// (wgmma, sm_90a). The key and the value of position p are the same 576-wide cache row for
// every head, so a block that serves every head of a token (up to 48 per block: K3's 96 take
// two blocks side by side, which the L2 serves from one read) reads each row from memory
// once, where one block per 16 heads read it num_heads / 16 times (6 at 96: 58 GB a step at
// batch 8 over 1M positions). The context is split over blocks (n_splits from the token and
// head counts only, so one captured graph serves every length), each split's partial
// softmax merged afterwards by combine_kernel.
//
// Multi-query attention has 96 query rows against one key, far from wgmma's 64-row M, so
// the products run transposed, keys on M: per round of 64 positions,
//   S^T[key][head] = K Q^T     A = the rows (K-major), B = the queries (K-major); the two
//                              warpgroups take half of the 576 dims each and swap halves
//                              through shared memory, each keeping the heads it owns;
//   softmax per head (a column): max and sum over the 64 rows within each warpgroup;
//   O^T[dim][head] += V^T P^T  A = the same rows read MN-major (the latent dims contiguous:
//                              the transpose the MMA does itself), B = P^T (K-major, bf16);
//                              warpgroup w takes dims 256w .. 256w + 255 (four m64 tiles).
// The rows come in by cp.async into the 128-byte swizzle (common/wgmma.cuh), two rounds in
// flight. fp32 softmax and accumulators, bf16 operands (Q and P rounded), as the grouped
// kernel of mla_attention.cu, which stays for what this one does not take (fp8 caches,
// other widths, GPUs without sm_90a).
#include <cuda.h>  // CUtensorMap (the encoder comes through the runtime's driver entry point)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "backend/cuda/common/bulk_copy.cuh"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/wgmma.cuh"
#include "backend/cuda/mla/mla_device.cuh"
#include "common/check.h"

namespace moonrun::cuda {

using namespace mla_detail;

namespace {

constexpr int kLatent = 512, kRope = 64, kRow = kLatent + kRope;  // K3's and K2's cache row
constexpr int kKeys = 64;                 // positions a round (the MMAs' M)
constexpr int kBlocks = kRow / 64;        // 64-wide column blocks of a row: 9
constexpr int kBlockBytes = kKeys * 128;  // one swizzled [64 rows][64] bf16 block
constexpr int kRoundBytes = kBlocks * kBlockBytes;  // 72 KB
constexpr int kMaxHeads = 48;             // heads a block (the MMAs' N)
constexpr int kSteps = kRow / 16;         // k16 steps of S^T: 36, 18 a warpgroup
constexpr int kHeadsThreads = 256;        // two warpgroups
constexpr int kMaxSplitsHeads = 160;

__host__ __device__ constexpr size_t smem_bytes(int nh) {
  return 1024 + 2 * static_cast<size_t>(kRoundBytes) +  // rows, two rounds
         static_cast<size_t>(kBlocks) * nh * 128 +      // Q, [block][head][64]
         static_cast<size_t>(nh) * 128 +                // P^T, [head][64 keys]
         2 * static_cast<size_t>(kKeys) * (nh / 2) * 4 +  // the S^T halves swapped between the groups
         4 * 4 * static_cast<size_t>(nh) +              // per-warp column maxima
         4 * static_cast<size_t>(nh);                   // m, f, l, spare
}

struct HeadsArgs {
  const float* q_abs;  // [n_tokens, H, 576] fp32
  PagedRows<bf16> cache;
  BatchTables batch;
  bool only_short_seqs;
  int num_heads, heads_per_block, n_splits;
  float scale_log2;  // softmax scale * log2(e): the softmax runs in base 2 (m in that domain)
  float* o_lat;     // [n_tokens, H, 512] when n_splits == 1
  float* part_acc;  // [n_tokens, H, n_splits, 512]
  float* part_ml;   // [n_tokens, H, n_splits, 2]
  // DSA (issue 38): token t attends only the positions in its row of selected [n_tokens, k]
  // (dsa_topk's: increasing positions, then -1s); its "position" j is an index into the row.
  const int32_t* selected = nullptr;
  int k = 0;
};

template <int N, bool kTransA>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (N == 16) wgmma::mma_m64n16k16_ss<kTransA>(d, a, b, accumulate);
  else if constexpr (N == 32) wgmma::mma_m64n32k16_ss<kTransA>(d, a, b, accumulate);
  else wgmma::mma_m64n48k16_ss<kTransA>(d, a, b, accumulate);
}

__device__ __forceinline__ void group_barrier(int wg) {  // the 128 threads of warpgroup wg
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}

// Positions [c0, c0 + n) into a round's buffer (rows past n zero: P is 0 there, and 0 * a
// stale NaN would not be), 16-byte pieces in the swizzle. Warp w takes rows 8w .. 8w + 7, its
// lanes the pieces of a row (32 at a time), so a row's address (a page-table read and a
// division) is worked out once a warp, not once a piece.
// sel: a DSA selection row (position c0 + r is sel[c0 + r]); null: the context itself.
__device__ __forceinline__ void load_round(unsigned char* buf, const PagedRows<bf16>& cache, const int32_t* pages,
                                           int c0, int n, const int32_t* sel) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int rr = 0; rr < kKeys / (kHeadsThreads / 32); ++rr) {
    const int r = (kKeys / (kHeadsThreads / 32)) * warp + rr;
    const bf16* src = r < n ? cache.at(pages, sel ? sel[c0 + r] : c0 + r) : nullptr;
#pragma unroll
    for (int k = 0; k < (kRow / 8 + 31) / 32; ++k) {
      const int c = lane + 32 * k;
      if (c >= kRow / 8) break;
      unsigned char* dst = buf + (c / 8) * kBlockBytes + sw128_offset(r, 8 * (c % 8));
      if (src) cp_async16(dst, src + 8 * c);
      else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

// grid (head blocks, splits, tokens), two warpgroups; NH = 16, 32 or 48 heads a block.
template <int NH>
__global__ void __launch_bounds__(kHeadsThreads, 1) decode_heads_kernel(const HeadsArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int NJ = NH / 8;       // 8-column blocks of the accumulators
  constexpr int OWN = NJ / 2;      // the blocks (heads) each warpgroup's softmax owns
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* rows = smem;                          // [2][kRoundBytes]
  unsigned char* q_s = rows + 2 * kRoundBytes;         // [kBlocks][NH][128 B]
  unsigned char* pt_s = q_s + kBlocks * NH * 128;      // [NH][128 B]: P^T
  float* swap = reinterpret_cast<float*>(pt_s + NH * 128);  // [2 groups][kKeys * NH / 2]
  float* red = swap + 2 * kKeys * (NH / 2);            // [4 warps][NH]
  float* m_s = red + 4 * NH;                           // [NH]
  float* f_s = m_s + NH;
  float* l_s = f_s + NH;

  const int t = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * a.heads_per_block;
  if (!computes(a.batch, t, a.only_short_seqs)) return;  // uniform over the block
  const int heads_here = min(a.heads_per_block, a.num_heads - h0);
  const int32_t* pages = a.batch.page_table + a.batch.seqs[a.batch.token_seq[t]].page_start;
  const int32_t* sel = a.selected ? a.selected + static_cast<int64_t>(t) * a.k : nullptr;
  const int visible = sel ? selected_count(sel, a.k, a.batch.positions[t] + 1) : a.batch.positions[t] + 1;
  const int span = ((visible + a.n_splits - 1) / a.n_splits + kKeys - 1) / kKeys * kKeys;
  const int begin = min(visible, split * span), end = min(visible, begin + span);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4, wl = warp % 4;
  const int g = lane / 4, tq = lane % 4;

  // The queries as bf16 in the swizzle (heads past the block's zero); the softmax state.
  for (int i = tid; i < NH * (kRow / 8); i += kHeadsThreads) {
    const int hh = i / (kRow / 8), c = i % (kRow / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (hh < heads_here) {
      const float4* src = reinterpret_cast<const float4*>(a.q_abs + (static_cast<int64_t>(t) * a.num_heads + h0 + hh) * kRow + 8 * c);
      const float4 x = src[0], y = src[1];
      __nv_bfloat162 p0 = __floats2bfloat162_rn(x.x, x.y), p1 = __floats2bfloat162_rn(x.z, x.w);
      __nv_bfloat162 p2 = __floats2bfloat162_rn(y.x, y.y), p3 = __floats2bfloat162_rn(y.z, y.w);
      v = make_uint4(*reinterpret_cast<uint32_t*>(&p0), *reinterpret_cast<uint32_t*>(&p1),
                     *reinterpret_cast<uint32_t*>(&p2), *reinterpret_cast<uint32_t*>(&p3));
    }
    *reinterpret_cast<uint4*>(q_s + (c / 8) * (NH * 128) + sw128_offset(hh, 8 * (c % 8))) = v;
  }
  if (tid < NH) m_s[tid] = -INFINITY;
  float acc[4][NH / 2];  // O^T: dims 256 wg + 64 mt + 16 wl + g (+8), heads 8j + 2tq (+1)
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int i = 0; i < NH / 2; ++i) acc[mt][i] = 0.0f;
  float l_part[OWN][2] = {};  // this thread's share of its owned heads' denominators

  if (begin < end) load_round(rows, a.cache, pages, begin, min(kKeys, end - begin), sel);
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  int buf = 0;
  const uint32_t q_base = smem_address(q_s), pt_base = smem_address(pt_s);
  for (int c0 = begin; c0 < end; c0 += kKeys, buf ^= 1) {
    const int n = min(kKeys, end - c0);
    unsigned char* cur = rows + buf * kRoundBytes;
    __syncthreads();  // both groups are done with the other buffer, P^T and the swap area
    if (c0 + kKeys < end)
      load_round(rows + (buf ^ 1) * kRoundBytes, a.cache, pages, c0 + kKeys, min(kKeys, end - c0 - kKeys), sel);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    fence_view_async_shared();
    __syncthreads();

    // S^T over this group's half of the dims: k16 steps 18 wg .. 18 wg + 17.
    const uint32_t rb = smem_address(cur);
    float s[NH / 2];
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kSteps / 2; ++k) {
      const int step = (kSteps / 2) * wg + k, blk = step / 4, off = 32 * (step % 4);
      mma_ss<NH, false>(s, wgmma::desc_sw128(rb + blk * kBlockBytes + off),
                        wgmma::desc_sw128(q_base + blk * (NH * 128) + off), k > 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(s);
    // Swap halves: each group hands the other the columns it owns; the twin thread (same
    // warp and lane in the other group) holds the same rows and columns.
    float* to_other = swap + (wg ^ 1) * (kKeys * (NH / 2)) + (wl * 32 + lane) * (NH / 4);
    const float* from_other = swap + wg * (kKeys * (NH / 2)) + (wl * 32 + lane) * (NH / 4);
    // (Both columns named at compile time and one picked: an index by wg would put s in local memory.)
#pragma unroll
    for (int j = 0; j < OWN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) to_other[4 * j + e] = wg == 0 ? s[4 * (OWN + j) + e] : s[4 * j + e];
    __syncthreads();
    // The owned columns: whole scores, scaled and masked (keys past n), column maxima.
    const int ka = 16 * wl + g, kb = ka + 8;  // this thread's rows (positions c0 + ka, c0 + kb)
    float v[OWN][4];
#pragma unroll
    for (int j = 0; j < OWN; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float mine = wg == 0 ? s[4 * j + e] : s[4 * (OWN + j) + e];
        const float x = (mine + from_other[4 * j + e]) * a.scale_log2;
        v[j][e] = (e < 2 ? ka : kb) < n ? x : -INFINITY;
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float mx = fmaxf(v[j][e], v[j][2 + e]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        if (g == 0) red[wl * NH + 8 * (wg * OWN + j) + 2 * tq + e] = mx;
      }
    }
    group_barrier(wg);
#pragma unroll
    for (int j = 0; j < OWN; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * (wg * OWN + j) + 2 * tq + e;
        const float m_old = m_s[col];
        float m_new = m_old;
#pragma unroll
        for (int w = 0; w < 4; ++w) m_new = fmaxf(m_new, red[w * NH + col]);
        const float p_a = exp2f(v[j][e] - m_new), p_b = exp2f(v[j][2 + e] - m_new);  // 0 past n
        const float f = exp2f(m_old - m_new);  // 0 on the first round (m_old = -inf)
        l_part[j][e] = l_part[j][e] * f + p_a + p_b;
        // P^T[col][key]: row col of a swizzled [NH][64] block.
        bf16* pt = reinterpret_cast<bf16*>(pt_s + sw128_offset(col, ka));
        *pt = __float2bfloat16_rn(p_a);
        *reinterpret_cast<bf16*>(pt_s + sw128_offset(col, kb)) = __float2bfloat16_rn(p_b);
        if (wl == 0 && g == 0) f_s[col] = f;  // m_s is rewritten after the barrier below
        v[j][e] = m_new;                      // kept for that
      }
    }
    group_barrier(wg);
    if (wl == 0 && g == 0) {
#pragma unroll
      for (int j = 0; j < OWN; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) m_s[8 * (wg * OWN + j) + 2 * tq + e] = v[j][e];
    }
    fence_view_async_shared();  // P^T, written by ordinary stores, is read by the MMAs next
    __syncthreads();
    // O^T = O^T * f + V^T P^T over this group's 256 dims.
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const float f0 = f_s[8 * j + 2 * tq], f1 = f_s[8 * j + 2 * tq + 1];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        acc[mt][4 * j] *= f0;
        acc[mt][4 * j + 1] *= f1;
        acc[mt][4 * j + 2] *= f0;
        acc[mt][4 * j + 3] *= f1;
      }
    }
    wgmma::fence();
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int k = 0; k < kKeys / 16; ++k)
        mma_ss<NH, true>(acc[mt], wgmma::desc_sw128_mn(rb + (4 * wg + mt) * kBlockBytes + 2048 * k, kBlockBytes),
                         wgmma::desc_sw128(pt_base + 32 * k), true);
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) wgmma::fence_operands(acc[mt]);
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  // The owned heads' denominators: over the 8 rows of each lane group, then the 4 warps.
#pragma unroll
  for (int j = 0; j < OWN; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float l = l_part[j][e];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      if (g == 0) red[wl * NH + 8 * (wg * OWN + j) + 2 * tq + e] = l;
    }
  __syncthreads();
  if (tid < NH) l_s[tid] = red[tid] + red[NH + tid] + red[2 * NH + tid] + red[3 * NH + tid];
  __syncthreads();
  // O^T: dims 256 wg + 64 mt + 16 wl + g (+8 for entries 2, 3), heads 8j + 2tq (+1).
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int hh = 8 * j + 2 * tq + e;
      if (hh >= heads_here) continue;
      const int64_t th = static_cast<int64_t>(t) * a.num_heads + h0 + hh;
      const float inv_l = a.n_splits == 1 ? 1.0f / l_s[hh] : 1.0f;
      float* dst = a.n_splits == 1 ? a.o_lat + th * kLatent : a.part_acc + (th * a.n_splits + split) * kLatent;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const int d = 256 * wg + 64 * mt + 16 * wl + g;
        dst[d] = acc[mt][4 * j + e] * inv_l;
        dst[d + 8] = acc[mt][4 * j + 2 + e] * inv_l;
      }
      if (a.n_splits > 1 && wg == 0 && wl == 0 && g == 0) {
        a.part_ml[(th * a.n_splits + split) * 2] = m_s[hh] * 0.6931471805599453f;  // natural log for the merge
        a.part_ml[(th * a.n_splits + split) * 2 + 1] = l_s[hh];
      }
    }
  }
#else
  __trap();
#endif
}

// grid (n_tokens, H), kThreads threads: o = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
__global__ void combine_kernel(const HeadsArgs a) {
  __shared__ float weight[kMaxSplitsHeads];
  const int t = blockIdx.x;
  if (!computes(a.batch, t, a.only_short_seqs)) return;
  const int64_t th = static_cast<int64_t>(t) * a.num_heads + blockIdx.y;
  const float* ml = a.part_ml + th * a.n_splits * 2;
  float M = -INFINITY;
  for (int s = 0; s < a.n_splits; ++s) M = fmaxf(M, ml[2 * s]);
  for (int s = threadIdx.x; s < a.n_splits; s += blockDim.x) weight[s] = expf(ml[2 * s] - M);  // empty: e^-inf = 0
  __syncthreads();
  float denom = 0;
  for (int s = 0; s < a.n_splits; ++s) denom += weight[s] * ml[2 * s + 1];
  const float inv = 1.0f / denom;
  const float* acc = a.part_acc + th * a.n_splits * kLatent;
  for (int j = threadIdx.x; j < kLatent; j += blockDim.x) {
    float v = 0;
    for (int s = 0; s < a.n_splits; ++s) v += weight[s] * acc[s * kLatent + j];
    a.o_lat[th * kLatent + j] = v * inv;
  }
}


// ---- the warp-specialised variant (MOONRUN_MLA_DECODE_TMA=1; off by default until measured) --
// The kernel above runs both warpgroups in lock-step through one chain a round (load issue,
// wait, S^T, swap, two softmax barriers, O^T): ncu on the 1M decode saw 20 % of DRAM
// bandwidth and ~9,000 cycles a 64-row round against ~2,200 of memory time. This one
// removes the chain's couplings:
//   - a producer warp loads each round with TMA tensor copies (cp.async.bulk.tensor, one per
//     16 rows x 64 columns: a page of 16 positions is 16 consecutive cache rows) into the
//     same 128-byte swizzle, completing on a "full" mbarrier per buffer; consumers free a
//     buffer on an "empty" one. No consumer thread computes a row address.
//   - the two consumer warpgroups split the block's heads (24 each at 48), not the dims:
//     S^T over all 576 dims for its own heads, softmax, O^T over all 512 dims for its own
//     heads. No swap of S^T halves, no block barrier in the loop (two 128-thread barriers
//     a round, for the column maxima and P^T): the groups drift apart and the tensor pipe
//     serves one while the other is in its softmax.
// The same products in the same precision (bf16 operands, fp32 softmax and accumulators),
// the same partial outputs and combine kernel.
constexpr int kTmaRows = 16;                       // rows of one TMA box (a 16-token page)
constexpr int kTmaConsumers = 256;                 // two consumer warpgroups
constexpr int kTmaThreads = kTmaConsumers + 32;    // and one producer warp

template <int NW>
__host__ __device__ constexpr size_t tma_smem_bytes() {
  return 1024 + 2 * static_cast<size_t>(kRoundBytes) +  // rows, two buffers
         static_cast<size_t>(kBlocks) * 2 * NW * 128 +   // Q, [block][2 NW heads][64]
         2 * static_cast<size_t>(NW) * 128 +             // P^T, one [NW][64 keys] a group
         2 * 2 * 4 * static_cast<size_t>(NW) * 4 +       // column maxima [parity][group][warp][NW]
         4 * 8;                                          // mbarriers: full[2], empty[2]
}

// D[64 x N] (+)= A[64 x 16] B[16 x N] for the consumer's N = NW heads.
template <int N, bool kTransA>
__device__ __forceinline__ void mma_w(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (N == 8) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, %7, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransA ? 1 : 0));
  } else if constexpr (N == 16) {
    wgmma::mma_m64n16k16_ss<kTransA>(d, a, b, accumulate);
  } else {
    static_assert(N == 24);
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %14, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, %12, %13, p, 1, 1, %15, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransA ? 1 : 0));
  }
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_load_2d(void* smem, const CUtensorMap* map, int col, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_address(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_address(bar))
      : "memory");
}

// grid (head blocks, splits, tokens), kTmaThreads threads: warps 0-7 the two consumer
// warpgroups (heads NW w .. NW w + NW - 1 of the block), warp 8 the producer.
template <int NW>
__global__ void __launch_bounds__(kTmaThreads, 1) decode_heads_tma_kernel(const HeadsArgs a,
                                                                          const __grid_constant__ CUtensorMap rows_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int NH = 2 * NW, NJ = NW / 8;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* rows = smem;                       // [2][kRoundBytes]
  unsigned char* q_s = rows + 2 * kRoundBytes;      // [kBlocks][NH][128 B]
  unsigned char* pt_s = q_s + kBlocks * NH * 128;   // [2 groups][NW][128 B]
  float* red = reinterpret_cast<float*>(pt_s + 2 * NW * 128);  // [2 parity][2 groups][4 warps][NW]
  uint64_t* full = reinterpret_cast<uint64_t*>(red + 2 * 2 * 4 * NW);
  uint64_t* empty = full + 2;

  const int t = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * a.heads_per_block;
  if (!computes(a.batch, t, a.only_short_seqs)) return;  // uniform over the block
  const int heads_here = min(a.heads_per_block, a.num_heads - h0);
  const int32_t* pages = a.batch.page_table + a.batch.seqs[a.batch.token_seq[t]].page_start;
  const int visible = a.batch.positions[t] + 1;
  const int span = ((visible + a.n_splits - 1) / a.n_splits + kKeys - 1) / kKeys * kKeys;
  const int begin = min(visible, split * span), end = min(visible, begin + span);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  for (int i = tid; i < NH * (kRow / 8); i += kTmaThreads) {
    const int hh = i / (kRow / 8), c = i % (kRow / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (hh < heads_here) {
      const float4* src = reinterpret_cast<const float4*>(a.q_abs + (static_cast<int64_t>(t) * a.num_heads + h0 + hh) * kRow + 8 * c);
      const float4 x = src[0], y = src[1];
      __nv_bfloat162 p0 = __floats2bfloat162_rn(x.x, x.y), p1 = __floats2bfloat162_rn(x.z, x.w);
      __nv_bfloat162 p2 = __floats2bfloat162_rn(y.x, y.y), p3 = __floats2bfloat162_rn(y.z, y.w);
      v = make_uint4(*reinterpret_cast<uint32_t*>(&p0), *reinterpret_cast<uint32_t*>(&p1),
                     *reinterpret_cast<uint32_t*>(&p2), *reinterpret_cast<uint32_t*>(&p3));
    }
    *reinterpret_cast<uint4*>(q_s + (c / 8) * (NH * 128) + sw128_offset(hh, 8 * (c % 8))) = v;
  }
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(&full[b], 1);                   // the producer's arrive (with the bytes)
      mbar_init(&empty[b], kTmaConsumers / 32);  // lane 0 of each consumer warp
    }
  }
  fence_view_async_shared();
  __syncthreads();  // the last block-wide barrier: from here the roles run on their own

  if (warp == kTmaConsumers / 32) {
    // Producer: round i into buffer i % 2, once the consumers have freed its last use.
    if (lane == 0) {
      const int ps = a.cache.page_size;
      for (int i = 0, c0 = begin; c0 < end; ++i, c0 += kKeys) {
        const int b = i & 1, n = min(kKeys, end - c0);
        if (i >= 2) mbar_wait(&empty[b], ((i >> 1) - 1) & 1);
        const int groups = (n + kTmaRows - 1) / kTmaRows;
        mbar_arrive_expect_tx(&full[b], static_cast<uint32_t>(groups * kBlocks * kTmaRows * 128));
        unsigned char* buf = rows + b * kRoundBytes;
        for (int g = 0; g < groups; ++g) {
          const int p = c0 + kTmaRows * g;
          const int row = pages[p / ps] * ps + p % ps;
          for (int blk = 0; blk < kBlocks; ++blk)
            tma_load_2d(buf + blk * kBlockBytes + g * kTmaRows * 128, &rows_map, 64 * blk, row, &full[b]);
        }
      }
    }
    return;
  }

  // Consumers: warpgroup wg, its warp wl; heads NW wg + 8j + 2tq (+1) of the block.
  const int wg = warp / 4, wl = warp % 4, g = lane / 4, tq = lane % 4;
  const uint32_t q_base = smem_address(q_s) + wg * NW * 128, pt_base = smem_address(pt_s) + wg * NW * 128;
  unsigned char* pt = pt_s + wg * NW * 128;
  float acc[8][NW / 2];  // O^T: dims 64 mt + 16 wl + g (+8), heads 8j + 2tq (+1)
#pragma unroll
  for (int mt = 0; mt < 8; ++mt)
#pragma unroll
    for (int i = 0; i < NW / 2; ++i) acc[mt][i] = 0.0f;
  float m[NJ][2], l_part[NJ][2];
#pragma unroll
  for (int j = 0; j < NJ; ++j) m[j][0] = m[j][1] = -INFINITY, l_part[j][0] = l_part[j][1] = 0.0f;
  const int ka = 16 * wl + g, kb = ka + 8;  // this thread's keys in a round

  for (int i = 0, c0 = begin; c0 < end; ++i, c0 += kKeys) {
    const int b = i & 1, n = min(kKeys, end - c0);
    unsigned char* cur = rows + b * kRoundBytes;
    mbar_wait(&full[b], (i >> 1) & 1);
    if (n < kKeys) {
      // The last round of a split: rows past n hold a partial page's unwritten rows or an
      // older round's; zero them (P is 0 there, and 0 * a stale NaN would not be). Both
      // groups write the same zeros.
      for (int idx = tid % 128; idx < (kKeys - n) * (kRow / 8); idx += 128) {
        const int r = n + idx / (kRow / 8), c = idx % (kRow / 8);
        *reinterpret_cast<uint4*>(cur + (c / 8) * kBlockBytes + sw128_offset(r, 8 * (c % 8))) = make_uint4(0, 0, 0, 0);
      }
      fence_view_async_shared();
      group_barrier(wg);
    }
    const uint32_t rb = smem_address(cur);
    float s[NW / 2];
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      const int blk = k / 4, off = 32 * (k % 4);
      mma_w<NW, false>(s, wgmma::desc_sw128(rb + blk * kBlockBytes + off),
                       wgmma::desc_sw128(q_base + blk * (NH * 128) + off), k > 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(s);
    // Scores in base 2, keys past n masked; column maxima over the thread's two keys, the
    // lane groups, then the 4 warps through shared memory.
    float* red_now = red + ((i & 1) * 2 + wg) * 4 * NW;
    float v[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[j][e] = (e < 2 ? ka : kb) < n ? s[4 * j + e] * a.scale_log2 : -INFINITY;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float mx = fmaxf(v[j][e], v[j][2 + e]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        if (g == 0) red_now[wl * NW + 8 * j + 2 * tq + e] = mx;
      }
    }
    group_barrier(wg);
    float f[NJ][2];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * j + 2 * tq + e;
        float m_new = m[j][e];
#pragma unroll
        for (int w = 0; w < 4; ++w) m_new = fmaxf(m_new, red_now[w * NW + col]);
        const float p_a = exp2f(v[j][e] - m_new), p_b = exp2f(v[j][2 + e] - m_new);  // 0 past n
        f[j][e] = exp2f(m[j][e] - m_new);  // 0 on the first round (m = -inf)
        m[j][e] = m_new;
        l_part[j][e] = l_part[j][e] * f[j][e] + p_a + p_b;
        *reinterpret_cast<bf16*>(pt + sw128_offset(col, ka)) = __float2bfloat16_rn(p_a);
        *reinterpret_cast<bf16*>(pt + sw128_offset(col, kb)) = __float2bfloat16_rn(p_b);
      }
    }
    fence_view_async_shared();  // P^T, written by ordinary stores, is read by the MMAs next
    group_barrier(wg);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt)
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        acc[mt][4 * j] *= f[j][0];
        acc[mt][4 * j + 1] *= f[j][1];
        acc[mt][4 * j + 2] *= f[j][0];
        acc[mt][4 * j + 3] *= f[j][1];
      }
    wgmma::fence();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt)
#pragma unroll
      for (int k = 0; k < kKeys / 16; ++k)
        mma_w<NW, true>(acc[mt], wgmma::desc_sw128_mn(rb + mt * kBlockBytes + 2048 * k, kBlockBytes),
                        wgmma::desc_sw128(pt_base + 32 * k), true);
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) wgmma::fence_operands(acc[mt]);
    if (lane == 0) mbar_arrive(&empty[b]);  // this warp is done with the buffer
  }
  // Denominators: over the lane groups, then the 4 warps (red's parity-0 half is free now:
  // every warp of the group is past its last round's barriers).
  group_barrier(wg);
  float* red_l = red + wg * 4 * NW;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float l = l_part[j][e];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      if (g == 0) red_l[wl * NW + 8 * j + 2 * tq + e] = l;
    }
  group_barrier(wg);
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * tq + e, hh = NW * wg + col;
      if (hh >= heads_here) continue;
      const float l = red_l[col] + red_l[NW + col] + red_l[2 * NW + col] + red_l[3 * NW + col];
      const int64_t th = static_cast<int64_t>(t) * a.num_heads + h0 + hh;
      const float inv_l = a.n_splits == 1 ? 1.0f / l : 1.0f;
      float* dst = a.n_splits == 1 ? a.o_lat + th * kLatent : a.part_acc + (th * a.n_splits + split) * kLatent;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        const int d = 64 * mt + 16 * wl + g;
        dst[d] = acc[mt][4 * j + e] * inv_l;
        dst[d + 8] = acc[mt][4 * j + 2 + e] * inv_l;
      }
      if (a.n_splits > 1 && wl == 0 && g == 0) {
        a.part_ml[(th * a.n_splits + split) * 2] = m[j][e] * 0.6931471805599453f;  // natural log for the merge
        a.part_ml[(th * a.n_splits + split) * 2 + 1] = l;
      }
    }
  }
#else
  __trap();
#endif
}

// The cache pool of a layer as a 2D tensor [rows, 576] bf16 (row stride 1152 bytes), boxes
// of 16 rows x 64 columns in the 128-byte swizzle. The pool's extent is not known here;
// TMA checks nothing but the declared extent (rows past it read as zeros), and every row a
// page table names is inside the pool, so the extent is declared as large as the encoder
// allows. One map per pool base, made once (an encode is a host call, no stream).
const CUtensorMap& rows_tensor_map(const void* base) {
  static std::mutex mu;
  static std::unordered_map<const void*, CUtensorMap> maps;
  std::lock_guard<std::mutex> lock(mu);
  auto it = maps.find(base);
  if (it != maps.end()) return it->second;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    MR_CHECK(fn != nullptr && q == cudaDriverEntryPointSuccess) << "cuTensorMapEncodeTiled unavailable";
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map;
  std::memset(&map, 0, sizeof map);
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kRow), cuuint64_t{1} << 31};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kRow) * sizeof(bf16)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(kTmaRows)}, elem[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, elem,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MR_CHECK(r == CUDA_SUCCESS) << "cuTensorMapEncodeTiled failed: " << static_cast<int>(r);
  return maps.emplace(base, map).first->second;
}

bool tma_switch_from_env() {
  const char* v = std::getenv("MOONRUN_MLA_DECODE_TMA");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}
bool g_use_tma = tma_switch_from_env();

// Blocks of at most 48 heads, as even as 16-head steps allow.
int heads_per_block(int num_heads) {
  const int blocks = (num_heads + kMaxHeads - 1) / kMaxHeads;
  return ((num_heads + blocks - 1) / blocks + 15) / 16 * 16;
}

}  // namespace

void set_mla_decode_tma(bool on) { g_use_tma = on; }
bool mla_decode_tma() { return g_use_tma; }

bool mla_decode_heads_applies(const MlaShape& shape, DType cache_dtype) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return cache_dtype == DType::BF16 && shape.kv_lora == kLatent && shape.rope == kRope && shape.num_heads > 0 &&
         wgmma_available(device);
}

int mla_decode_heads_splits(int n_tokens, int num_heads) {
  // One block a multiprocessor (the rows of two rounds fill its shared memory): two waves
  // of an H200's 132.
  const int blocks = std::max(1, n_tokens) * ((num_heads + heads_per_block(num_heads) - 1) / heads_per_block(num_heads));
  return std::clamp((264 + blocks - 1) / blocks, 1, kMaxSplitsHeads);
}

void mla_decode_heads(const float* q_abs, int n_tokens, const MlaShape& shape, const BatchTables& batch,
                      const KvLayer& cache, bool only_short_seqs, float* o_lat, float* partials,
                      cudaStream_t stream, const int32_t* selected, int k) {
  if (n_tokens <= 0) return;
  HeadsArgs a{};
  a.selected = selected;
  a.k = k;
  a.q_abs = q_abs;
  a.cache = paged_rows<bf16>(cache);
  a.batch = batch;
  a.only_short_seqs = only_short_seqs;
  a.num_heads = shape.num_heads;
  a.heads_per_block = heads_per_block(shape.num_heads);
  a.n_splits = mla_decode_heads_splits(n_tokens, shape.num_heads);
  a.scale_log2 = 1.4426950408889634f / std::sqrt(static_cast<float>(shape.nope + shape.rope));
  a.o_lat = o_lat;
  a.part_acc = partials;
  a.part_ml = partials + static_cast<size_t>(n_tokens) * shape.num_heads * a.n_splits * kLatent;
  const dim3 grid((shape.num_heads + a.heads_per_block - 1) / a.heads_per_block, a.n_splits, n_tokens);
  // The TMA variant loads a round as boxes of whole pages: not a selection's scattered rows.
  if (g_use_tma && !selected && cache.page_size_tokens % kTmaRows == 0 &&
      reinterpret_cast<uintptr_t>(cache.base) % 16 == 0) {
    const CUtensorMap& map = rows_tensor_map(cache.base);
    auto launch = [&](auto kernel, size_t smem) {
      allow_dynamic_smem(kernel, smem);
      kernel<<<grid, kTmaThreads, smem, stream>>>(a, map);
    };
    if (a.heads_per_block == 16) launch(decode_heads_tma_kernel<8>, tma_smem_bytes<8>());
    else if (a.heads_per_block == 32) launch(decode_heads_tma_kernel<16>, tma_smem_bytes<16>());
    else launch(decode_heads_tma_kernel<24>, tma_smem_bytes<24>());
  } else {
    auto launch = [&](auto kernel, int nh) {
      allow_dynamic_smem(kernel, smem_bytes(nh));
      kernel<<<grid, kHeadsThreads, smem_bytes(nh), stream>>>(a);
    };
    if (a.heads_per_block == 16) launch(decode_heads_kernel<16>, 16);
    else if (a.heads_per_block == 32) launch(decode_heads_kernel<32>, 32);
    else launch(decode_heads_kernel<48>, 48);
  }
  CUDA_CHECK_LAUNCH();
  if (a.n_splits > 1) {
    combine_kernel<<<dim3(n_tokens, shape.num_heads), kThreads, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace moonrun::cuda
