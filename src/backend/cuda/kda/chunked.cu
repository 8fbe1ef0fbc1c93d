// The chunked (WY) form of the KDA recurrence (prefill), the twin of cpu::kda_chunked,
// whose comment has the derivation. For a chunk of C tokens of one head, with in-chunk
// cumulative log decays G_c = sum_{s<=c} g_s (per channel, non-increasing in c):
//   L[c][j] = beta_c sum_x k_c k_j exp(G_c - G_j)  (j < c);   T = (I + L)^-1 Diag(beta)
//   W = T (exp(G) k),  U = T v;   V' = U - W S
//   o_c = (q_c exp(G_c)) S + sum_{j<=c} P[c][j] V'_j,  P[c][j] = sum_x q_c k_j exp(G_c - G_j)
//   S   = Diag(exp(G_last)) S + sum_c (k_c exp(G_last - G_c)) V'_c^T
// Everything left of "V' = U - W S" does not read S, so it is computed for many chunks at
// once (four parallel kernels); only the last step walks the chunks in order, and it is the
// same per-column layout as the recurrent kernel (a v-column of S evolves on its own).
// All fp32, plain FMAs (no tensor cores, so no TF32). The pair exponents are evaluated
// directly as exp(G_c - G_j) <= 1, so nothing overflows however strong the decay (the CPU
// factors them through a block reference row; both only evaluate exponents <= 0).
//
// Temporaries: chunks are processed in passes of at most kChunksPerPass, so the workspace
// is bounded (K3, 96 heads x 128: about 200 MB) however long the prompt.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/kda/kda_internal.cuh"
#include "backend/cuda/kda/kda_ops.h"

namespace moonrun::cuda {

namespace {

using kda_detail::kColsPerBlock;
using kda_detail::kMaxRowsPerThread;
using kda_detail::kRowWarps;
using kda_detail::warp_allreduce_sum;

constexpr int kMaxChunk = 64;        // the solve kernel keeps a [C, C] block in shared memory
constexpr int kChunksPerPass = 16;   // bounds the workspace (1024 tokens at chunk 64)
constexpr int kMaxXPerLane = kda_detail::kMaxHeadDim / 32;  // pair kernel: a head row over a warp
constexpr int kRowTile = 2 * kRowWarps;  // state kernel: chunk rows reduced per round

// One pass's temporaries, carved from the workspace. Token-indexed arrays are [Tp, H, d] as
// the inputs; chunk-indexed ones [P, H, ...]; pair matrices have row stride Cmax.
struct PassBuffers {
  float *G, *W, *U, *QG, *KG;  // [Tp, H, d]: cumulative decay, WY rows, q exp(G), k exp(G_last - G)
  float *A, *P;                // [P, H, Cmax, Cmax]: -L then (I+L)^-1 - I; the q-k pair matrix
  float* eGlast;               // [P, H, d]: exp(G_last)
};

struct PassShape {
  int T_pass, H, d, Cmax;
  __device__ int chunk_len(int chunk) const { return min(Cmax, T_pass - chunk * Cmax); }
  __device__ int64_t row(int token, int h) const { return (static_cast<int64_t>(token) * H + h) * d; }
  __device__ int64_t pair(int chunk, int h) const { return (static_cast<int64_t>(chunk) * H + h) * Cmax * Cmax; }
};

// G = in-chunk cumulative sum of g; eGlast = exp(G of the chunk's last row).
// grid (chunks, H), block d.
__global__ void chunk_cumsum_kernel(PassShape sh, const float* __restrict__ g, PassBuffers b) {
  const int chunk = blockIdx.x, h = blockIdx.y, x = threadIdx.x;
  const int t0 = chunk * sh.Cmax, C = sh.chunk_len(chunk);
  float G = 0.0f;
  for (int c = 0; c < C; ++c) {
    const int64_t at = sh.row(t0 + c, h) + x;
    G = g[at] + G;
    b.G[at] = G;
  }
  b.eGlast[(static_cast<int64_t>(chunk) * sh.H + h) * sh.d + x] = expf(G);
}

// A[c][j] = -beta_c sum_x k_c k_j exp(G_c - G_j) (j < c) and P[c][j] = sum_x q_c k_j
// exp(G_c - G_j) (j <= c). grid (chunks, H), block (32, kRowWarps): a warp per row c, its
// lanes over x (coalesced), one warp sum per pair.
__global__ void chunk_pairs_kernel(PassShape sh, const float* __restrict__ q, const float* __restrict__ k,
                                   const float* __restrict__ beta, PassBuffers b) {
  const int chunk = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  const int t0 = chunk * sh.Cmax, C = sh.chunk_len(chunk), d = sh.d;
  float* A = b.A + sh.pair(chunk, h);
  float* P = b.P + sh.pair(chunk, h);
  for (int c = threadIdx.y; c < C; c += kRowWarps) {
    const int64_t rc = sh.row(t0 + c, h);
    float qc[kMaxXPerLane], kc[kMaxXPerLane], Gc[kMaxXPerLane];
#pragma unroll
    for (int r = 0; r < kMaxXPerLane; ++r) {
      const int x = lane + 32 * r;
      qc[r] = x < d ? q[rc + x] : 0.0f;
      kc[r] = x < d ? k[rc + x] : 0.0f;
      Gc[r] = x < d ? b.G[rc + x] : 0.0f;
    }
    const float bc = beta[static_cast<int64_t>(t0 + c) * sh.H + h];
    for (int j = 0; j <= c; ++j) {
      const int64_t rj = sh.row(t0 + j, h);
      float lk = 0.0f, lq = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxXPerLane; ++r) {
        const int x = lane + 32 * r;
        if (x < d) {
          const float kj = k[rj + x] * expf(Gc[r] - b.G[rj + x]);  // exponent <= 0
          lk += kc[r] * kj;
          lq += qc[r] * kj;
        }
      }
      lk = warp_allreduce_sum(lk);
      lq = warp_allreduce_sum(lq);
      if (lane == 0) {
        if (j < c) A[c * sh.Cmax + j] = -bc * lk;
        P[c * sh.Cmax + j] = lq;
      }
    }
  }
}

// A = -L (strictly lower) becomes X = (I + L)^-1 - I by forward substitution, row by row:
// X = N + N X with N = -L, so X[c][i] = N[c][i] + sum_{i<m<c} N[c][m] X[m][i] needs only the
// final rows m < c. grid (chunks, H), block Cmax (thread i = column).
__global__ void chunk_solve_kernel(PassShape sh, PassBuffers b) {
  __shared__ float As[kMaxChunk][kMaxChunk + 1];
  const int chunk = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  const int C = sh.chunk_len(chunk);
  float* A = b.A + sh.pair(chunk, h);
  for (int c = 1; c < C; ++c)
    if (i < c) As[c][i] = A[c * sh.Cmax + i];
  __syncthreads();
  for (int c = 1; c < C; ++c) {
    float acc = 0.0f;
    if (i < c) {
      acc = As[c][i];
      for (int m = i + 1; m < c; ++m) acc += As[c][m] * As[m][i];
    }
    __syncthreads();  // row c is still read as N by the other columns
    if (i < c) As[c][i] = acc;
    __syncthreads();
  }
  for (int c = 1; c < C; ++c)
    if (i < c) A[c * sh.Cmax + i] = As[c][i];
}

// The WY rows with T = (X + I) Diag(beta):  W_c = beta_c ek_c + sum_{j<c} X[c][j] beta_j ek_j
// (ek = exp(G) k), U likewise with v; and the rows the state kernel reads: QG = q exp(G),
// KG = k exp(G_last - G). grid (chunks * H, Cmax) (blockIdx.y = row c), block d.
__global__ void chunk_wy_kernel(PassShape sh, const float* __restrict__ q, const float* __restrict__ k,
                                const float* __restrict__ v, const float* __restrict__ beta, PassBuffers b) {
  const int chunk = blockIdx.x / sh.H, h = blockIdx.x % sh.H, c = blockIdx.y, x = threadIdx.x;
  const int t0 = chunk * sh.Cmax, C = sh.chunk_len(chunk);
  if (c >= C) return;
  const float* X = b.A + sh.pair(chunk, h) + c * sh.Cmax;
  const int64_t rc = sh.row(t0 + c, h) + x;
  const float bc = beta[static_cast<int64_t>(t0 + c) * sh.H + h];
  const float Gc = b.G[rc];
  float w = bc * (expf(Gc) * k[rc]);
  float u = bc * v[rc];
  for (int j = 0; j < c; ++j) {
    const int64_t rj = sh.row(t0 + j, h) + x;
    const float a = X[j] * beta[static_cast<int64_t>(t0 + j) * sh.H + h];
    w += a * (expf(b.G[rj]) * k[rj]);
    u += a * v[rj];
  }
  b.W[rc] = w;
  b.U[rc] = u;
  b.QG[rc] = q[rc] * expf(Gc);
  const float Glast = b.G[sh.row(t0 + C - 1, h) + x];
  b.KG[rc] = k[rc] * expf(Glast - Gc);  // exponent <= 0
}

// The chunks in order, per v-column: V' = U - W S;  o = QG S + P V';  S = eGlast S + KG^T V'.
// grid (H, ceil(d / 32)), block (32, kRowWarps); layout as kda_recurrent_kernel (thread =
// column j x rows i = w + kRowWarps r, S in registers). Column sums over the rows go through
// shared memory kRowTile chunk rows at a time; V' of the chunk stays in shared memory.
__global__ void __launch_bounds__(kColsPerBlock* kRowWarps)
    chunk_state_kernel(PassShape sh, int n_chunks, PassBuffers b, float* __restrict__ S, float* __restrict__ o) {
  __shared__ float partial[kRowWarps][kRowTile][kColsPerBlock + 1];
  __shared__ float vp[kMaxChunk][kColsPerBlock + 1];  // V'[c][column]
  const int h = blockIdx.x, lane = threadIdx.x, w = threadIdx.y, d = sh.d;
  const int j = blockIdx.y * kColsPerBlock + lane;
  const bool col_ok = j < d;
  float* Sh = S + static_cast<int64_t>(h) * d * d;
  float s[kMaxRowsPerThread];
#pragma unroll
  for (int r = 0; r < kMaxRowsPerThread; ++r) {
    const int i = w + kRowWarps * r;
    s[r] = (i < d && col_ok) ? Sh[static_cast<int64_t>(i) * d + j] : 0.0f;
  }
  // This thread's rows of column j dotted with row c of M ([T, H, d]).
  auto row_dot = [&](const float* M, int token) {
    const float* Mr = M + sh.row(token, h);
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerThread; ++r) {
      const int i = w + kRowWarps * r;
      if (i < d) acc += Mr[i] * s[r];
    }
    return acc;
  };
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int t0 = chunk * sh.Cmax, C = sh.chunk_len(chunk);
    // V' = U - W S: thread (lane, w) finishes chunk rows c0 + w and c0 + w + kRowWarps.
    for (int c0 = 0; c0 < C; c0 += kRowTile) {
      for (int cc = 0; cc < kRowTile; ++cc)
        partial[w][cc][lane] = c0 + cc < C ? row_dot(b.W, t0 + c0 + cc) : 0.0f;
      __syncthreads();
      for (int cc = w; cc < kRowTile; cc += kRowWarps) {
        const int c = c0 + cc;
        if (c >= C) continue;
        float ws = 0.0f;
#pragma unroll
        for (int ww = 0; ww < kRowWarps; ++ww) ws += partial[ww][cc][lane];
        vp[c][lane] = col_ok ? b.U[sh.row(t0 + c, h) + j] - ws : 0.0f;
      }
      __syncthreads();  // partial is rewritten; vp complete after the last round
    }
    // o_c = QG_c S + sum_{m<=c} P[c][m] V'_m
    const float* P = b.P + sh.pair(chunk, h);
    for (int c0 = 0; c0 < C; c0 += kRowTile) {
      for (int cc = 0; cc < kRowTile; ++cc)
        partial[w][cc][lane] = c0 + cc < C ? row_dot(b.QG, t0 + c0 + cc) : 0.0f;
      __syncthreads();
      for (int cc = w; cc < kRowTile; cc += kRowWarps) {
        const int c = c0 + cc;
        if (c >= C || !col_ok) continue;
        float oc = 0.0f;
#pragma unroll
        for (int ww = 0; ww < kRowWarps; ++ww) oc += partial[ww][cc][lane];
        for (int m = 0; m <= c; ++m) oc += P[c * sh.Cmax + m] * vp[m][lane];
        o[sh.row(t0 + c, h) + j] = oc;
      }
      __syncthreads();
    }
    // S = Diag(exp(G_last)) S + sum_c KG_c V'_c^T
    const float* eG = b.eGlast + (static_cast<int64_t>(chunk) * sh.H + h) * d;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerThread; ++r) {
      const int i = w + kRowWarps * r;
      if (i >= d) continue;
      float si = s[r] * eG[i];
      for (int c = 0; c < C; ++c) si += b.KG[sh.row(t0 + c, h) + i] * vp[c][lane];
      s[r] = si;
    }
    __syncthreads();  // vp is rewritten by the next chunk
  }
#pragma unroll
  for (int r = 0; r < kMaxRowsPerThread; ++r) {
    const int i = w + kRowWarps * r;
    if (i < d && col_ok) Sh[static_cast<int64_t>(i) * d + j] = s[r];
  }
}

int chunks_of(int n_tokens, int chunk_size) { return (n_tokens + chunk_size - 1) / chunk_size; }

}  // namespace

int64_t kda_chunked_workspace_floats(int n_tokens, int num_heads, int head_dim, int chunk_size) {
  if (n_tokens <= 0) return 0;
  const int64_t P = std::min(chunks_of(n_tokens, chunk_size), kChunksPerPass);
  const int64_t Tp = std::min<int64_t>(n_tokens, P * chunk_size);
  const int64_t H = num_heads, d = head_dim, C = chunk_size;
  return 5 * Tp * H * d + 2 * P * H * C * C + P * H * d;
}

void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int n_tokens,
                 int num_heads, int head_dim, float* S, float* o, float* workspace, cudaStream_t stream,
                 int chunk_size) {
  if (n_tokens <= 0 || num_heads <= 0) return;
  kda_detail::check_head_dim(head_dim, "kda_chunked");
  if (chunk_size < 1 || chunk_size > kMaxChunk)
    throw CudaError("kda_chunked: chunk_size " + std::to_string(chunk_size) + " outside [1, 64]");
  const int H = num_heads, d = head_dim, Cmax = chunk_size;
  const int64_t P = std::min(chunks_of(n_tokens, Cmax), kChunksPerPass);
  const int64_t Tp = std::min<int64_t>(n_tokens, P * Cmax);
  PassBuffers b;
  float* p = workspace;
  for (float** a : {&b.G, &b.W, &b.U, &b.QG, &b.KG}) *a = p, p += Tp * H * d;
  for (float** a : {&b.A, &b.P}) *a = p, p += P * H * Cmax * Cmax;
  b.eGlast = p;

  for (int pass_t0 = 0; pass_t0 < n_tokens; pass_t0 += kChunksPerPass * Cmax) {
    const int T_pass = std::min(n_tokens - pass_t0, kChunksPerPass * Cmax);
    const int n_chunks = chunks_of(T_pass, Cmax);
    const PassShape sh{T_pass, H, d, Cmax};
    const int64_t off = static_cast<int64_t>(pass_t0) * H * d;  // [T, H, d] row offset
    const float *qp = q + off, *kp = k + off, *vp = v + off, *gp = g + off;
    const float* bp = beta + static_cast<int64_t>(pass_t0) * H;
    const dim3 chunk_head(n_chunks, H);
    chunk_cumsum_kernel<<<chunk_head, d, 0, stream>>>(sh, gp, b);
    CUDA_CHECK_LAUNCH();
    chunk_pairs_kernel<<<chunk_head, dim3(32, kRowWarps), 0, stream>>>(sh, qp, kp, bp, b);
    CUDA_CHECK_LAUNCH();
    chunk_solve_kernel<<<chunk_head, Cmax, 0, stream>>>(sh, b);
    CUDA_CHECK_LAUNCH();
    chunk_wy_kernel<<<dim3(n_chunks * H, Cmax), d, 0, stream>>>(sh, qp, kp, vp, bp, b);
    CUDA_CHECK_LAUNCH();
    chunk_state_kernel<<<dim3(H, (d + kColsPerBlock - 1) / kColsPerBlock), dim3(kColsPerBlock, kRowWarps), 0,
                         stream>>>(sh, n_chunks, b, S, o + off);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace moonrun::cuda
