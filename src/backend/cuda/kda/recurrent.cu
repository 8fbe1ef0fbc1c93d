// The KDA recurrence token by token (decode), the twin of cpu::kda_recurrent, in two
// layouts: kda_recurrent_head_kernel (below) for head widths 32, 64 and 128, and the
// column-tile kernel described here for any other width up to 256. Per head h:
//   S <- Diag(exp(g_t)) S;  u = beta_t (v_t - S^T k_t);  S += k_t u^T;  o_t = S^T q_t
// with S [d_k, d_v] fp32. Given q, k, g, beta, each v-column j of S evolves on its own
// (u_j and o_j only read column j), so a block owns one head and a tile of 32 columns:
// lane = column (S rows are contiguous in j, so the state load/store is coalesced), and the
// kWarps warps split the d_k rows, each thread keeping its rows of its column in registers
// for the whole call. The two column sums per token (S^T k and S^T q) are per-thread
// partial sums over its rows, combined across the warps through shared memory.
#include <cuda_runtime.h>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/kda/kda_internal.cuh"
#include "backend/cuda/kda/kda_ops.h"

namespace moonrun::cuda {

namespace {

using kda_detail::kColsPerBlock;
using kda_detail::kMaxRowsPerThread;
using kda_detail::kRowWarps;

// q, k, v, g [T, H, d]; beta [T, H]; o [T, H, d]; sequence z = blockIdx.z: its tokens
// [token_start, token_start + n_new), its S [H, d, d] at S_base + slot * slot_stride.
// grid (H, ceil(d / 32), n_seqs), block (32, kRowWarps).
__global__ void __launch_bounds__(kColsPerBlock* kRowWarps)
    kda_recurrent_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                         const float* __restrict__ g, const float* __restrict__ beta, const BatchSeq* __restrict__ seqs,
                         int H, int d, float* __restrict__ S_base, int64_t slot_stride, bool only_short_seqs,
                         float* __restrict__ o) {
  __shared__ float partial[kRowWarps][kColsPerBlock + 1];
  const BatchSeq seq = seqs[blockIdx.z];
  if (only_short_seqs && seq.n_new > kShortSeqMaxNewTokens) return;  // the whole block leaves together
  const int h = blockIdx.x, lane = threadIdx.x, w = threadIdx.y;
  const int j = blockIdx.y * kColsPerBlock + lane;  // this thread's v-column
  const bool col_ok = j < d;
  float* Sh = S_base + seq.state_slot * slot_stride + static_cast<int64_t>(h) * d * d;
  // Rows i = w + kRowWarps * r of column j.
  float s[kMaxRowsPerThread];
#pragma unroll
  for (int r = 0; r < kMaxRowsPerThread; ++r) {
    const int i = w + kRowWarps * r;
    s[r] = (i < d && col_ok) ? Sh[static_cast<int64_t>(i) * d + j] : 0.0f;
  }
  for (int t = seq.token_start; t < seq.token_start + seq.n_new; ++t) {
    const int64_t row = (static_cast<int64_t>(t) * H + h) * d;
    // Decay, then this thread's share of (S^T k)_j.
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerThread; ++r) {
      const int i = w + kRowWarps * r;
      if (i < d) {
        s[r] *= expf(g[row + i]);
        acc += k[row + i] * s[r];
      }
    }
    partial[w][lane] = acc;
    __syncthreads();
    float kS = 0.0f;  // every warp sums the partials in the same order: the same u everywhere
#pragma unroll
    for (int ww = 0; ww < kRowWarps; ++ww) kS += partial[ww][lane];
    const float u = col_ok ? (v[row + j] - kS) * beta[static_cast<int64_t>(t) * H + h] : 0.0f;
    __syncthreads();  // partial is rewritten below
    // Rank-1 update, then this thread's share of (S^T q)_j.
    acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerThread; ++r) {
      const int i = w + kRowWarps * r;
      if (i < d) {
        s[r] += k[row + i] * u;
        acc += q[row + i] * s[r];
      }
    }
    partial[w][lane] = acc;
    __syncthreads();
    if (w == 0 && col_ok) {
      float oj = 0.0f;
#pragma unroll
      for (int ww = 0; ww < kRowWarps; ++ww) oj += partial[ww][lane];
      o[row + j] = oj;
    }
    __syncthreads();  // partial is rewritten by the next token
  }
#pragma unroll
  for (int r = 0; r < kMaxRowsPerThread; ++r) {
    const int i = w + kRowWarps * r;
    if (i < d && col_ok) Sh[static_cast<int64_t>(i) * d + j] = s[r];
  }
}

// The same recurrence with a whole head's state per block, for head_dim D in {32, 64, 128}
// (K3: 128): thread t owns column j = t % D and the kRows = D * D / 256 rows
// p * kRows .. + kRows - 1 of it, p = t / D. A decode step is one pass over S (read once,
// written once); each thread starts all its kRows loads before anything else, so a block has
// the whole 64 KB head in flight, and two blocks a multiprocessor keep HBM busy. The token's
// exp(g), k and q rows are staged in shared memory (every column reads them); the column
// sums over the D / kRows row parts go through shared memory, summed in the same order by
// every part, so all parts hold the same u.
template <int D>
__global__ void __launch_bounds__(256, 2)
    kda_recurrent_head_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                              const float* __restrict__ g, const float* __restrict__ beta,
                              const BatchSeq* __restrict__ seqs, int H, float* __restrict__ S_base,
                              int64_t slot_stride, bool only_short_seqs, float* __restrict__ o) {
  constexpr int kThreads = 256, kParts = kThreads / D, kRows = D / kParts;
  __shared__ float eg_s[D], k_s[D], q_s[D];
  __shared__ float part_ks[kParts][D], part_o[kParts][D];
  const BatchSeq seq = seqs[blockIdx.y];
  if (only_short_seqs && seq.n_new > kShortSeqMaxNewTokens) return;  // the whole block leaves together
  const int h = blockIdx.x, tid = threadIdx.x, j = tid % D, p = tid / D;
  float* Sh = S_base + seq.state_slot * slot_stride + static_cast<int64_t>(h) * D * D + static_cast<int64_t>(p) * kRows * D + j;
  float s[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) s[r] = Sh[r * D];
  for (int t = seq.token_start; t < seq.token_start + seq.n_new; ++t) {
    const int64_t row = (static_cast<int64_t>(t) * H + h) * D;
    if (tid < D) {
      eg_s[tid] = expf(g[row + tid]);
      k_s[tid] = k[row + tid];
      q_s[tid] = q[row + tid];
    }
    const float vj = v[row + j], bt = beta[static_cast<int64_t>(t) * H + h];
    __syncthreads();
    // Decay, then this part's share of (S^T k)_j.
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = p * kRows + r;
      s[r] *= eg_s[i];
      acc += k_s[i] * s[r];
    }
    part_ks[p][j] = acc;
    __syncthreads();
    float kS = 0.0f;
#pragma unroll
    for (int pp = 0; pp < kParts; ++pp) kS += part_ks[pp][j];
    const float u = (vj - kS) * bt;
    // Rank-1 update, then this part's share of (S^T q)_j.
    acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = p * kRows + r;
      s[r] += k_s[i] * u;
      acc += q_s[i] * s[r];
    }
    part_o[p][j] = acc;
    __syncthreads();  // also: every read of this token's staged rows is done
    if (p == 0) {
      float oj = 0.0f;
#pragma unroll
      for (int pp = 0; pp < kParts; ++pp) oj += part_o[pp][j];
      o[row + j] = oj;
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) Sh[r * D] = s[r];
}

}  // namespace

void kda_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                   const BatchSeq* seqs, int n_seqs, int num_heads, int head_dim, float* S_base, int64_t slot_stride,
                   bool only_short_seqs, float* o, cudaStream_t stream) {
  if (n_seqs <= 0 || num_heads <= 0) return;
  kda_detail::check_head_dim(head_dim, "kda_recurrent");
  const dim3 head_grid(num_heads, n_seqs);
  switch (head_dim) {
    case 32:
      kda_recurrent_head_kernel<32><<<head_grid, 256, 0, stream>>>(q, k, v, g, beta, seqs, num_heads, S_base,
                                                                   slot_stride, only_short_seqs, o);
      CUDA_CHECK_LAUNCH();
      return;
    case 64:
      kda_recurrent_head_kernel<64><<<head_grid, 256, 0, stream>>>(q, k, v, g, beta, seqs, num_heads, S_base,
                                                                   slot_stride, only_short_seqs, o);
      CUDA_CHECK_LAUNCH();
      return;
    case 128:
      kda_recurrent_head_kernel<128><<<head_grid, 256, 0, stream>>>(q, k, v, g, beta, seqs, num_heads, S_base,
                                                                    slot_stride, only_short_seqs, o);
      CUDA_CHECK_LAUNCH();
      return;
    default: break;
  }
  const dim3 grid(num_heads, (head_dim + kColsPerBlock - 1) / kColsPerBlock, n_seqs);
  const dim3 block(kColsPerBlock, kRowWarps);
  kda_recurrent_kernel<<<grid, block, 0, stream>>>(q, k, v, g, beta, seqs, num_heads, head_dim, S_base, slot_stride,
                                                   only_short_seqs, o);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
