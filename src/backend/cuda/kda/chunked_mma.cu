// The chunked (WY) form of the KDA recurrence on the tensor cores: the same algebra as
// chunked.cu (whose comment states it), with bf16 operands and fp32 accumulation, in two
// kernels per pass of chunks (64 tokens a chunk):
//
// 1. prep, one block per (chunk, head), everything that does not read S:
//    - G = in-chunk cumulative sum of g (fp32, in shared memory);
//    - the pair matrices L[c][j] = beta_c sum_x k_c k_j exp(G_c - G_j) and
//      P[c][j] = sum_x q_c k_j exp(G_c - G_j). Off the diagonal 16x16 blocks they are MMAs
//      after factoring exp(G_c - G_j) = exp(G_c - G_r) exp(G_r - G_j) through r, the first row
//      of c's 16-row sub-chunk: both exponents are <= 0 (G does not increase along the
//      chunk), so neither factor overflows however strong the decay, and when one
//      underflows the true product is smaller still. Inside a diagonal block the pairs are
//      evaluated directly in fp32, as FLA's chunk_kda does;
//    - (I + L)^-1 in fp32: the 16x16 diagonal blocks by substitution, the blocks below from
//      them as a terminating series (step 5);
//    - W = T (exp(G) k) and U = T v as MMAs, T = (I + L)^-1 Diag(beta) rounded to bf16;
//    - the rows the state kernel reads: QG = q exp(G), KG = k exp(G_last - G), exp(G_last).
// 2. state, one block per (head, 64 v-columns), the chunks in order: S [D, 64] stays in the
//    MMA accumulators (fp32); per chunk V' = U - W S, o = QG S + P V' and
//    S = Diag(exp(G_last)) S + KG^T V'. Only this walk is sequential; o is computed in it
//    because S at the chunk's start and V' are already on the multiprocessor (a separate
//    output kernel had to write and read both back: 150 MB a pass at K3's width), and the
//    next chunk's tiles load during this one.
//
// Exponentials are ex2.approx.ftz of G kept in log2 units (g is scaled by log2(e) as it is
// summed): one instruction each, where __expf is a multiply, a range test and two
// predicated multiplies around the same ex2. Every argument is <= 0; a result that flushes
// to zero (below 2^-126) multiplies a row whose true weight is as small, and every result
// is rounded to bf16 or multiplies an fp32 state whose own rounding is larger.
//
// This is FLA's chunk_kda in structure and precision (it too keeps S in fp32 and feeds bf16
// to the tensor cores). The fp32 kernels of chunked.cu stay the reference: the fp32 mode
// and head widths other than 32, 64 and 128 run there.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/bulk_copy.cuh"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/kda/kda_ops.h"

namespace moonrun::cuda {

namespace {

constexpr int kC = 64;              // tokens per chunk
constexpr int kSub = 16;            // sub-chunk: one MMA row tile, and the factorisation's reference
// Prep kernel: sixteen warps. One block fills a multiprocessor's shared memory, so its warps
// are all the multiprocessor has to hide latency with (at eight it was issue-bound, 3.6 cycles
// a warp between instructions).
constexpr int kPrepThreads = 512;
// Chunks a pass: bounds the workspace (4,096 tokens a pass: about 460 MB at 96 heads of 128).
// At 8,192 tokens fewer a pass is slower - 32 by 2.5 %, 16 by 7 % - as each pass starts and
// ends a state walk whose 192 blocks leave most of the machine idle.
constexpr int kChunksPerPass = 64;
// State kernel: v-columns per block. K3 (96 heads of 128) gives 192 blocks, two a multiprocessor
// (97 KB of shared memory each): every block of the pass is resident at once.
template <int D>
constexpr int kBVof = D < 64 ? D : 64;
constexpr int kKtRows = 96;         // the three reference-scaled key blocks: 16 + 32 + 48 rows

constexpr float kLog2e = 1.4426950408889634f;
// 2^x (x <= 0 here), results below 2^-126 flushed to zero.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Four 8x8 bf16 matrices, transposed on the way (ldmatrix .trans): lane l gives the row
// address of matrix l / 8.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const bf16* p) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// A fragment (16 x 16 at m0, k0) of a row-major [m][k] tile, by one ldmatrix: lanes 0-15
// name rows m0 .. m0 + 15 at k0, lanes 16-31 the same rows at k0 + 8 (rows 16-byte aligned).
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16* base, int ld, int m0, int k0, int lane) {
  const auto p = static_cast<uint32_t>(__cvta_generic_to_shared(base + (m0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(p)
               : "memory");
}
// A fragment (16 x 16 at m0, k0) of A = M^T, M stored row-major [k][m].
__device__ __forceinline__ void load_a_trans(uint32_t a[4], const bf16* base, int ld, int m0, int k0, int lane) {
  const int mat = lane >> 3;
  ldsm_x4_trans(a, base + (k0 + (lane & 7) + (mat >> 1) * 8) * ld + m0 + (mat & 1) * 8);
}
// B fragment (16 x 8 at k0, n0) of B = M^T, M stored row-major [n][k] (the "col" layout).
__device__ __forceinline__ void load_b(uint32_t b[2], const bf16* base, int ld, int n0, int k0, int lane) {
  const bf16* p = base + (n0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
  b[0] = bf16_pair(p);
  b[1] = bf16_pair(p + 8);
}
// B fragments of two n8 tiles (16 x 16 at k0, n0) of a row-major [k][n] tile: b[0..1] for
// columns n0 .. n0 + 7, b[2..3] for n0 + 8 .. n0 + 15.
__device__ __forceinline__ void load_b2_trans(uint32_t b[4], const bf16* base, int ld, int k0, int n0, int lane) {
  ldsm_x4_trans(b, base + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  mma_m16n8k16_bf16(c, a[0], a[1], a[2], a[3], b0, b1);
}
// acc[n] += A[m0 .. m0 + 15][0 .. K) x B[0 .. K)[8 (nt0 + n) ..]: one warp's row tile of a
// row-major A times kN n8 tiles of a row-major [K, *] B (the state walk's W S and QG S).
template <int K, int kN>
__device__ __forceinline__ void mma_rows(float (&acc)[kN][4], const bf16* A, int lda, int m0, const bf16* B, int ldb,
                                         int nt0, int lane) {
  static_assert(kN % 2 == 0, "B fragments come in pairs of n8 tiles");
#pragma unroll 4
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[4];
    load_a(a, A, lda, m0, k0, lane);
#pragma unroll
    for (int n = 0; n < kN; n += 2) {
      uint32_t b[4];
      load_b2_trans(b, B, ldb, k0, 8 * (nt0 + n), lane);
      mma(acc[n], a, b[0], b[1]);
      mma(acc[n + 1], a, b[2], b[3]);
    }
  }
}


// One pass's temporaries, one contiguous tile per (chunk, head), every tile a full kC rows
// (rows past the pass's last token are zeros): the state kernel copies a tile with a flat
// index and constant offsets, no row arithmetic and no bounds tests (with token rows
// [T, H, D] the copies' index math was two fifths of its instructions).
struct Workspace {
  bf16 *W, *QG, *KG;  // [chunks, H, kC, D]: WY rows, q exp(G), k exp(G_last - G)
  bf16* U;            // [chunks, H, D / kBV, kC, kBV]: WY rows of v, a state block's kBV columns
                      // contiguous (bf16, as FLA keeps u: fp32 measured 3 % slower at K3 width)
  bf16* P;            // [chunks, H, kC, kC]: the q-k pair matrix, lower triangle with diagonal
  float* eGlast;      // [chunks, H, D]
};

struct PassArgs {
  const float *q, *k, *v, *g, *beta;  // this pass's first token
  int T, H;                           // tokens in the pass, heads
  Workspace w;
};

// A (chunk, head) block's chunk: blockIdx.x the chunk, blockIdx.y the head; its C <= kC
// tokens start at t0, and token c's row of a [T, H, D] array is at row(c).
template <int D>
struct ChunkOfHead {
  int chunk, h, H, t0, C;
  __device__ explicit ChunkOfHead(const PassArgs& a)
      : chunk(blockIdx.x), h(blockIdx.y), H(a.H), t0(chunk * kC), C(min(kC, a.T - chunk * kC)) {}
  __device__ int64_t row(int c) const { return (static_cast<int64_t>(t0 + c) * H + h) * D; }
};

template <int D>
struct PrepSmem {
  static constexpr int ld = D + 8;  // bf16 row stride: +16 bytes keeps the fragment reads conflict-free
  float G[kC][D];                   // g, then its in-chunk cumulative sum times log2(e)
  float q[kC][D], k[kC][D];  // (v goes from global memory to registers to bf16: step 6)
  float A[kC][kC + 1];  // N = -L, strictly lower
  float beta[kC];
  float seg_total[kPrepThreads / D][D];  // the cumulative sum's segment totals
  union alignas(16) {
    struct {
      bf16 Ks[kC][ld], Qs[kC][ld];  // k, q exp(G_c - G_r), r = c's sub-chunk's first row
      bf16 Kt[kKtRows][ld];         // for I = 1..3: k_j exp(G_{16I} - G_j), j < 16I, at row 8I(I-1)
      // The lower-left 8x8 quadrant of each diagonal 16x16 block, through m = the block's
      // ninth row: rows 16s + i of Qa are k_{m+i} exp(G_{m+i} - G_m) (i < 8) and
      // q_{m+i-8} exp(G_{m+i-8} - G_m) (i >= 8); row 8s + j of Kb is k_{16s+j} exp(G_m - G_{16s+j}).
      bf16 Qa[kC][ld], Kb[kC / 2][ld];
    } pairs;
    struct {
      bf16 T[kC][kC + 8];  // (I + L)^-1 Diag(beta)
      bf16 ek[kC][ld], v[kC][ld];
      float Minv[kC][kC + 1];  // (I + L)^-1, lower triangle with diagonal (step 5)
      float F31[kSub][kSub + 1];
    } wy;
  } u;
};

// One block per (chunk, head), kPrepThreads threads. The chunk's g, q and k come into shared
// memory first, all copies in flight together; after them only v is read from global memory
// (into registers, under the inverse).
template <int D>
__global__ void __launch_bounds__(kPrepThreads) kda_prep_kernel(PassArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& s = *reinterpret_cast<PrepSmem<D>*>(smem_raw);
  constexpr int ld = PrepSmem<D>::ld, kWarps = kPrepThreads / 32;
  const ChunkOfHead<D> ch(a);
  const int chunk = ch.chunk, h = ch.h, H = ch.H, t0 = ch.t0, C = ch.C;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  auto row = [&](int c) { return ch.row(c); };

  // 1. The chunk into shared memory; rows past its end are zeros (they decay nothing, add
  //    nothing, and G_last = G[kC - 1]). Commit groups in the order they are needed (g for
  //    the cumulative sum, then q and k), so the sum starts while q and k are arriving.
  {
    constexpr int kPieces = D / 4, kRowStep = kPrepThreads / kPieces;
    static_assert(kPrepThreads % kPieces == 0 && kC % kRowStep == 0, "prep: the threads tile whole rows");
    const int x = (tid % kPieces) * 4, c0 = tid / kPieces;
    const int64_t first = row(c0) + x, step = static_cast<int64_t>(kRowStep) * H * D;
    auto load = [&](float (*dst)[D], const float* src) {
      const float* p = src + first;
#pragma unroll
      for (int i = 0; i < kC / kRowStep; ++i, p += step) {
        const int c = c0 + kRowStep * i;
        if (c < C) cp_async16(&dst[c][x], p);
        else *reinterpret_cast<float4*>(&dst[c][x]) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    load(s.G, a.g);
    load(s.q, a.q);
    load(s.k, a.k);
  }
  if (tid < kC) s.beta[tid] = tid < C ? a.beta[static_cast<int64_t>(t0 + tid) * H + h] : 0.0f;
  asm volatile("cp.async.wait_group 2;\n" ::: "memory");  // g
  __syncthreads();
  // G's cumulative sum: every thread scans kC / kSegs rows of one column, then adds the
  // totals of the segments above it.
  {
    constexpr int kSegs = kPrepThreads / D, kSegRows = kC / kSegs;
    static_assert(kPrepThreads % D == 0 && kC % kSegs == 0, "prep: the scan's segments tile the chunk");
    const int x = tid % D, seg = tid / D, c0 = kSegRows * seg;
    float G = 0.0f;
#pragma unroll
    for (int c = c0; c < c0 + kSegRows; ++c) s.G[c][x] = G = fmaf(s.G[c][x], kLog2e, G);
    s.seg_total[seg][x] = G;
    __syncthreads();
    float above = 0.0f;
    for (int j = 0; j < seg; ++j) above += s.seg_total[j][x];
#pragma unroll
    for (int c = c0; c < c0 + kSegRows; ++c) s.G[c][x] += above;
    if (seg == kSegs - 1) a.w.eGlast[(static_cast<int64_t>(chunk) * H + h) * D + x] = exp2_ftz(G + above);
  }
  cp_async_wait_all();  // q and k
  __syncthreads();

  // 2. The scaled rows: Qs, Ks and Kt here; QG and KG out to the workspace. A thread keeps
  //    one column pair and steps down the rows.
  constexpr int kColPairs = D / 2, kRowStep = kPrepThreads / kColPairs;
  static_assert(kPrepThreads % kColPairs == 0, "prep: the threads tile whole rows");
  const int xp = 2 * (tid % kColPairs), row_first = tid / kColPairs;
  const int64_t tile = (static_cast<int64_t>(chunk) * H + h) * kC * D;  // this (chunk, head)'s workspace tiles
  {
    const float2 Gl = *reinterpret_cast<const float2*>(&s.G[kC - 1][xp]);
#pragma unroll
    for (int c = row_first; c < kC; c += kRowStep) {
      const int r = c & ~(kSub - 1);
      const float2 qv = *reinterpret_cast<const float2*>(&s.q[c][xp]), kv = *reinterpret_cast<const float2*>(&s.k[c][xp]);
      const float2 G = *reinterpret_cast<const float2*>(&s.G[c][xp]), Gr = *reinterpret_cast<const float2*>(&s.G[r][xp]);
      const float e0 = exp2_ftz(G.x - Gr.x), e1 = exp2_ftz(G.y - Gr.y);
      *reinterpret_cast<uint32_t*>(&s.u.pairs.Qs[c][xp]) = pack_bf16(qv.x * e0, qv.y * e1);
      *reinterpret_cast<uint32_t*>(&s.u.pairs.Ks[c][xp]) = pack_bf16(kv.x * e0, kv.y * e1);
      const int m = r + kSub / 2, i = c - r;
      const float2 Gm = *reinterpret_cast<const float2*>(&s.G[m][xp]);
      if (i >= kSub / 2) {
        const float f0 = exp2_ftz(G.x - Gm.x), f1 = exp2_ftz(G.y - Gm.y);
        *reinterpret_cast<uint32_t*>(&s.u.pairs.Qa[c - kSub / 2][xp]) = pack_bf16(kv.x * f0, kv.y * f1);
        *reinterpret_cast<uint32_t*>(&s.u.pairs.Qa[c][xp]) = pack_bf16(qv.x * f0, qv.y * f1);
      } else {
        *reinterpret_cast<uint32_t*>(&s.u.pairs.Kb[r / 2 + i][xp]) =
            pack_bf16(kv.x * exp2_ftz(Gm.x - G.x), kv.y * exp2_ftz(Gm.y - G.y));
      }
      // Rows past the end: q = k = 0, so zeros, as the state kernel expects.
      *reinterpret_cast<uint32_t*>(a.w.QG + tile + c * D + xp) = pack_bf16(qv.x * exp2_ftz(G.x), qv.y * exp2_ftz(G.y));
      *reinterpret_cast<uint32_t*>(a.w.KG + tile + c * D + xp) =
          pack_bf16(kv.x * exp2_ftz(Gl.x - G.x), kv.y * exp2_ftz(Gl.y - G.y));
    }
    for (int rr = row_first; rr < kKtRows; rr += kRowStep) {
      const int I = rr < 16 ? 1 : rr < 48 ? 2 : 3, j = rr - 8 * I * (I - 1), r = kSub * I;
      const float2 kv = *reinterpret_cast<const float2*>(&s.k[j][xp]);
      const float2 Gj = *reinterpret_cast<const float2*>(&s.G[j][xp]), Gr = *reinterpret_cast<const float2*>(&s.G[r][xp]);
      *reinterpret_cast<uint32_t*>(&s.u.pairs.Kt[rr][xp]) =
          pack_bf16(kv.x * exp2_ftz(Gr.x - Gj.x), kv.y * exp2_ftz(Gr.y - Gj.y));
    }
  }
  __syncthreads();

  bf16* Pg = a.w.P + (static_cast<int64_t>(chunk) * H + h) * kC * kC;
  // 3. The six blocks below the diagonal, for L and for P: twelve 16x16 products; then the
  //    lower-left quadrants of the four diagonal blocks, L and P in one 16x8 product each.
  for (int item = warp; item < 12; item += kWarps) {
    const int blk = item >> 1;
    const bool is_p = item & 1;
    const int I = blk == 0 ? 1 : blk < 3 ? 2 : 3, J = blk - I * (I - 1) / 2;
    const bf16* Am = is_p ? &s.u.pairs.Qs[kSub * I][0] : &s.u.pairs.Ks[kSub * I][0];
    const bf16* Bm = &s.u.pairs.Kt[8 * I * (I - 1) + kSub * J][0];
    float acc[2][4] = {};
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t af[4], bf[2];
      load_a(af, Am, ld, 0, k0, lane);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        load_b(bf, Bm, ld, 8 * n, k0, lane);
        mma(acc[n], af, bf[0], bf[1]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c = kSub * I + g + 8 * half;
      const float bc = s.beta[c];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const int j = kSub * J + 8 * n + 2 * t;
        const float v0 = acc[n][2 * half], v1 = acc[n][2 * half + 1];
        if (is_p) {
          *reinterpret_cast<uint32_t*>(Pg + c * kC + j) = pack_bf16(v0, v1);
        } else {
          s.A[c][j] = -bc * v0;
          s.A[c][j + 1] = -bc * v1;
        }
      }
    }
  }
  if (warp >= 12) {
    const int sub0 = kSub * (warp - 12), m = sub0 + kSub / 2;
    float acc[4] = {};
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t af[4], bf[2];
      load_a(af, &s.u.pairs.Qa[0][0], ld, sub0, k0, lane);
      load_b(bf, &s.u.pairs.Kb[0][0], ld, sub0 / 2, k0, lane);
      mma(acc, af, bf[0], bf[1]);
    }
    const int c = m + g, j = sub0 + 2 * t;  // rows g: L's (c, j); rows g + 8: P's
    s.A[c][j] = -s.beta[c] * acc[0];
    s.A[c][j + 1] = -s.beta[c] * acc[1];
    *reinterpret_cast<uint32_t*>(Pg + c * kC + j) = pack_bf16(acc[2], acc[3]);
    Pg[j * kC + c] = Pg[(j + 1) * kC + c] = __float2bfloat16_rn(0.0f);  // the mirror, above the diagonal
  }
  // 4. What is left of the diagonal blocks, in fp32: the pairs (c, j < c) inside each 8-row
  //    group (8 x 28), two threads a pair (threads 0 .. 447), each summing half the columns,
  //    so no pair above the diagonal is evaluated and one shuffle joins the halves. Lanes
  //    start at different columns (4 apart, wrapping), so a quarter-warp's 16-byte reads hit
  //    distinct banks whatever rows its pairs name (rows are D floats apart: the same bank).
  //    The diagonal itself (P only: q_c . k_c, exponent 0) goes to the 64 threads left, and
  //    each pair writes the zero of P its pair mirrors above the diagonal.
  {
    constexpr int kGroup = kSub / 2, kPairs = kGroup * (kGroup - 1) / 2, kPairThreads = 2 * (kC / kGroup) * kPairs;
    static_assert(kPairThreads + kC == kPrepThreads && kPairThreads % 32 == 0, "prep: two threads a diagonal pair");
    constexpr int kHalf = D / 2;
    if (tid < kPairThreads) {
      const int pair = tid >> 1, half = tid & 1, group0 = kGroup * (pair / kPairs);
      int p = pair % kPairs, r = 1;  // p = r (r - 1) / 2 + jj, jj < r
      while (r * (r + 1) / 2 <= p) ++r;
      const int c = group0 + r, j = group0 + p - r * (r - 1) / 2;
      const int x0 = (4 * lane) % kHalf, xh = half * kHalf;
      float lk[4] = {}, lq[4] = {};
#pragma unroll 4
      for (int i = 0; i < kHalf; i += 4) {
        const int x = xh + (x0 + i) % kHalf;
        const float4 kc = *reinterpret_cast<const float4*>(&s.k[c][x]), qc = *reinterpret_cast<const float4*>(&s.q[c][x]);
        const float4 kj = *reinterpret_cast<const float4*>(&s.k[j][x]);
        const float4 Gc = *reinterpret_cast<const float4*>(&s.G[c][x]), Gj = *reinterpret_cast<const float4*>(&s.G[j][x]);
        const float w0 = kj.x * exp2_ftz(Gc.x - Gj.x), w1 = kj.y * exp2_ftz(Gc.y - Gj.y);  // j < c: exponents <= 0
        const float w2 = kj.z * exp2_ftz(Gc.z - Gj.z), w3 = kj.w * exp2_ftz(Gc.w - Gj.w);
        lk[0] += kc.x * w0, lk[1] += kc.y * w1, lk[2] += kc.z * w2, lk[3] += kc.w * w3;
        lq[0] += qc.x * w0, lq[1] += qc.y * w1, lq[2] += qc.z * w2, lq[3] += qc.w * w3;
      }
      float L = (lk[0] + lk[1]) + (lk[2] + lk[3]), P = (lq[0] + lq[1]) + (lq[2] + lq[3]);
      L += __shfl_xor_sync(0xffffffffu, L, 1);
      P += __shfl_xor_sync(0xffffffffu, P, 1);
      if (half == 0) {
        s.A[c][j] = -s.beta[c] * L;
        Pg[c * kC + j] = __float2bfloat16_rn(P);
        Pg[j * kC + c] = __float2bfloat16_rn(0.0f);
      }
    } else {
      const int c = tid - kPairThreads, x0 = (4 * lane) % D;
      float d[4] = {};
#pragma unroll 4
      for (int i = 0; i < D; i += 4) {
        const int x = (x0 + i) % D;
        const float4 kc = *reinterpret_cast<const float4*>(&s.k[c][x]), qc = *reinterpret_cast<const float4*>(&s.q[c][x]);
        d[0] += qc.x * kc.x, d[1] += qc.y * kc.y, d[2] += qc.z * kc.z, d[3] += qc.w * kc.w;
      }
      Pg[c * kC + c] = __float2bfloat16_rn((d[0] + d[1]) + (d[2] + d[3]));
    }
  }
  __syncthreads();

  // v's rows for step 6, asked for now so they arrive under the inverse.
  constexpr int kVRows = kC / kRowStep;
  float2 vreg[kVRows];
#pragma unroll
  for (int i = 0; i < kVRows; ++i) {
    const int c = row_first + kRowStep * i;
    vreg[i] = c < C ? __ldg(reinterpret_cast<const float2*>(a.v + row(c) + xp)) : make_float2(0.0f, 0.0f);
  }

  // 5. Minv = (I + L)^-1 = (I - N)^-1, in fp32. The diagonal 16x16 blocks D_i = Minv_ii first:
  //    warp w < 4's lane q < 16 walks down column q of block w (Minv = I + N Minv, row by row:
  //    no other lane's values needed). The blocks below without a second substitution: with
  //    E = Diag(D) N_off (N_off: N's blocks below the diagonal), I - N = Diag(D)^-1 (I - E),
  //    and E, strictly lower over four block rows, has E^4 = 0, so
  //    Minv = (I + E + E^2 + E^3) Diag(D) = F Diag(D), where
  //      a. E_ij = D_i N_ij                          (the six blocks, three elements a thread)
  //      b. F_20 = E_20 + E_21 E_10, F_31 = E_31 + E_32 E_21   (one element a thread)
  //      c. F_30 = E_30 + E_31 E_10 + E_32 F_20      (two threads an element)
  //      d. Minv_ij = F_ij D_j, straight into T in step 6   (F_10, F_21, F_32 = E)
  //    Four barriers and every thread busy in each step, where substituting band by band took
  //    nine, with half the threads idle in the last band.
  auto& M = s.u.wy.Minv;   // D_i on the diagonal; E, then F, below
  auto& F31 = s.u.wy.F31;  // F_31 apart: step c still reads E_31
  if (warp < 4 && lane < kSub) {
    const int b0 = kSub * warp, q = lane;
    float col[kSub];
#pragma unroll
    for (int r = 0; r < kSub; ++r) {
      float acc[2] = {};
#pragma unroll
      for (int m = 0; m < r; ++m) acc[m & 1] += s.A[b0 + r][b0 + m] * col[m];
      col[r] = r == q ? 1.0f : r > q ? acc[0] + acc[1] : 0.0f;
      M[b0 + r][b0 + q] = col[r];
    }
  }
  __syncthreads();
  // The six blocks below the diagonal, b = 0 .. 5: (1,0), (2,0), (2,1), (3,0), (3,1), (3,2).
  constexpr int kBelowPerThread = 6 * kSub * kSub / kPrepThreads;
  static_assert(6 * kSub * kSub % kPrepThreads == 0 && 2 * kSub * kSub == kPrepThreads, "prep: the inverse's split");
  auto block_i = [](int b) { return b == 0 ? 1 : b < 3 ? 2 : 3; };
  {  // a.
    float y[kBelowPerThread];
#pragma unroll
    for (int n = 0; n < kBelowPerThread; ++n) {
      const int e = tid + kPrepThreads * n, b = e / (kSub * kSub), i = block_i(b), j = b - i * (i - 1) / 2;
      const int r = (e / kSub) % kSub, q = e % kSub;
      float acc[4] = {};
#pragma unroll
      for (int m = 0; m < kSub; ++m) acc[m % 4] += M[kSub * i + r][kSub * i + m] * s.A[kSub * i + m][kSub * j + q];
      y[n] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
#pragma unroll
    for (int n = 0; n < kBelowPerThread; ++n) {  // no one reads M's blocks below the diagonal in a.
      const int e = tid + kPrepThreads * n, b = e / (kSub * kSub), i = block_i(b), j = b - i * (i - 1) / 2;
      M[kSub * i + (e / kSub) % kSub][kSub * j + e % kSub] = y[n];
    }
  }
  __syncthreads();
  {  // b. Block (i, i - 2) through (i - 1), i = 2 (in place: a thread reads only its own E_20) or 3.
    const int i = 2 + tid / (kSub * kSub), r = (tid / kSub) % kSub, q = tid % kSub;
    float acc[4] = {};
#pragma unroll
    for (int m = 0; m < kSub; ++m)
      acc[m % 4] += M[kSub * i + r][kSub * (i - 1) + m] * M[kSub * (i - 1) + m][kSub * (i - 2) + q];
    const float f = M[kSub * i + r][kSub * (i - 2) + q] + ((acc[0] + acc[1]) + (acc[2] + acc[3]));
    if (i == 2) M[kSub * i + r][q] = f;
    else F31[r][q] = f;
  }
  __syncthreads();
  {  // c. Thread pair (2e, 2e + 1): E_31 E_10 and E_32 F_20 for element e of block (3, 0).
    const int e = tid >> 1, k = 1 + (tid & 1), r = e / kSub, q = e % kSub;
    float acc[4] = {};
#pragma unroll
    for (int m = 0; m < kSub; ++m) acc[m % 4] += M[3 * kSub + r][kSub * k + m] * M[kSub * k + m][q];
    float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (k == 1) M[3 * kSub + r][q] += sum;
  }
  __syncthreads();

  // 6. T = Minv Diag(beta) as bf16 (d. for the blocks below the diagonal), then exp(G) k and
  //    v as bf16 operands.
  auto& T = s.u.wy.T;
#pragma unroll
  for (int n = 0; n < kBelowPerThread; ++n) {
    const int e = tid + kPrepThreads * n, b = e / (kSub * kSub), i = block_i(b), j = b - i * (i - 1) / 2;
    const int r = (e / kSub) % kSub, q = e % kSub;
    const float* Frow = b == 4 ? &F31[r][0] : &M[kSub * i + r][kSub * j];
    float acc[4] = {};
#pragma unroll
    for (int m = 0; m < kSub; ++m) acc[m % 4] += Frow[m] * M[kSub * j + m][kSub * j + q];
    T[kSub * i + r][kSub * j + q] = __float2bfloat16_rn(((acc[0] + acc[1]) + (acc[2] + acc[3])) * s.beta[kSub * j + q]);
  }
  for (int e = tid; e < kC * kC / 2; e += kPrepThreads) {  // the diagonal blocks, zeros above them
    const int c = e / (kC / 2), j = (e % (kC / 2)) * 2;
    if (j / kSub < c / kSub) continue;
    auto tval = [&](int jj) { return jj <= c ? M[c][jj] * s.beta[jj] : 0.0f; };
    *reinterpret_cast<uint32_t*>(&T[c][j]) = pack_bf16(tval(j), tval(j + 1));
  }
#pragma unroll
  for (int i = 0; i < kVRows; ++i) {
    const int c = row_first + kRowStep * i;
    const float2 kv = *reinterpret_cast<const float2*>(&s.k[c][xp]), G = *reinterpret_cast<const float2*>(&s.G[c][xp]);
    const float2 vv = vreg[i];
    *reinterpret_cast<uint32_t*>(&s.u.wy.ek[c][xp]) = pack_bf16(kv.x * exp2_ftz(G.x), kv.y * exp2_ftz(G.y));
    *reinterpret_cast<uint32_t*>(&s.u.wy.v[c][xp]) = pack_bf16(vv.x, vv.y);
  }
  __syncthreads();

  // 7. W = T ek (warps 0-3, 8-11) and U = T v (warps 4-7, 12-15), 16 rows and half the
  //    columns a warp; T is lower triangular, so k-tiles <= the row tile. Rows past the end
  //    are zeros (beta = 0 there, so T's rows are), as the state kernel expects.
  {
    constexpr int kBV = kBVof<D>;
    static_assert(kWarps == 16, "prep: W and U take 16 warps");
    const int which = (warp >> 2) & 1, mt = warp & 3, n_lo = (warp >> 3) * (D / 2);
    const bf16* Bm = which ? &s.u.wy.v[0][0] : &s.u.wy.ek[0][0];
#pragma unroll 2
    for (int n0 = n_lo; n0 < n_lo + D / 2; n0 += 16) {
      float acc[2][4] = {};
      for (int kt = 0; kt <= mt; ++kt) {
        uint32_t af[4], bf[4];
        load_a(af, &s.u.wy.T[0][0], kC + 8, kSub * mt, kSub * kt, lane);
        load_b2_trans(bf, Bm, ld, kSub * kt, n0, lane);
        mma(acc[0], af, bf[0], bf[1]);
        mma(acc[1], af, bf[2], bf[3]);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = kSub * mt + g + 8 * half;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const int x = n0 + 8 * n + 2 * t;
          if (which)
            *reinterpret_cast<uint32_t*>(a.w.U + tile + (x / kBV) * kC * kBV + c * kBV + x % kBV) =
                pack_bf16(acc[n][2 * half], acc[n][2 * half + 1]);
          else
            *reinterpret_cast<uint32_t*>(a.w.W + tile + c * D + x) = pack_bf16(acc[n][2 * half], acc[n][2 * half + 1]);
        }
      }
    }
  }
}

// The state walk with the output fused in, one block per (head, kBV v-columns), kStateThreads
// threads, the chunks in order. Per chunk, with S [D, kBV] (S at the chunk's start) in the MMA
// accumulators (fp32):
//   Sb = bf16(S)                               (shared memory: the B operand below)
//   V' = U - W Sb                              (bf16, shared memory only)
//   o  = QG Sb + P V'                          (fp32, out: this block's kBV columns)
//   S  = Diag(exp(G_last)) S + KG^T V'
// o and the S update read the same operands and nothing of each other, so they run between
// the same two barriers. S at a chunk's start and V' never leave the multiprocessor.
// Every global read is a cp.async issued half a chunk ahead, in two commit groups: W and U
// (issued once this chunk's V' is done), KG, exp(G_last), QG and P (once o and S are).
// Eight warps (sixteen, with half the tiles each, measured 11 % slower at D = 128).
constexpr int kStateThreads = 256;
constexpr int kStateWarps = kStateThreads / 32;

template <int D, int kBV>
struct StateSmem {
  static constexpr int ld = D + 8, ldv = kBV + 8, ldp = kC + 8;
  static constexpr int ldu = kBV + 8;  // a quarter-warp's 4-byte reads of 8 rows hit distinct banks
  bf16 W[kC][ld], KG[kC][ld], QG[kC][ld];
  bf16 U[kC][ldu];
  float eG[D];
  bf16 Sb[D][ldv];  // S as bf16, the B operand of W S and QG S
  bf16 Vp[kC][ldv];
  bf16 P[kC][ldp];
};

// Copies one workspace tile (kRows x kCols elements, contiguous) into a padded [kRows][ld]
// array of shared memory: piece e (16 bytes) is row e / (kCols / kPer), so a thread's pieces
// are its first one plus constant offsets.
template <int kThreads, int kRows, int kCols, int ld, typename T>
__device__ __forceinline__ void load_tile(T (*dst)[ld], const T* src, int tid) {
  constexpr int kPer = 16 / sizeof(T), kPiecesPerRow = kCols / kPer, kPieces = kRows * kPiecesPerRow;
  static_assert(kThreads % kPiecesPerRow == 0, "state: the threads tile whole rows");
  static_assert(kPieces % kThreads == 0 || kPieces < kThreads, "state: whole tiles a pass");
  const int r = tid / kPiecesPerRow, x = (tid % kPiecesPerRow) * kPer;
  if (kPieces < kThreads && tid >= kPieces) return;
#pragma unroll
  for (int i = 0; i < (kPieces + kThreads - 1) / kThreads; ++i)
    cp_async16(&dst[r + i * (kThreads / kPiecesPerRow)][x], src + (tid + i * kThreads) * kPer);
}

// Chunk `chunk`'s W and U (one commit group). With chunk == n_chunks it commits an empty
// group, so the wait counts stay the same on the last chunk.
template <int D, int kBV>
__device__ __forceinline__ void load_wu(const PassArgs& a, StateSmem<D, kBV>& s, int chunk, int n_chunks, int h,
                                        int col0, int tid) {
  if (chunk < n_chunks) {
    const int64_t tile = (static_cast<int64_t>(chunk) * a.H + h) * kC * D;
    load_tile<kStateThreads, kC, D, StateSmem<D, kBV>::ld>(s.W, a.w.W + tile, tid);
    load_tile<kStateThreads, kC, kBV, StateSmem<D, kBV>::ldu>(s.U, a.w.U + tile + static_cast<int64_t>(col0) * kC, tid);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Chunk `chunk`'s KG, exp(G_last), QG and P (the other commit group).
template <int D, int kBV>
__device__ __forceinline__ void load_kgqp(const PassArgs& a, StateSmem<D, kBV>& s, int chunk, int n_chunks, int h,
                                          int tid) {
  if (chunk < n_chunks) {
    const int64_t ch = static_cast<int64_t>(chunk) * a.H + h;
    load_tile<kStateThreads, kC, D, StateSmem<D, kBV>::ld>(s.KG, a.w.KG + ch * kC * D, tid);
    load_tile<kStateThreads, kC, D, StateSmem<D, kBV>::ld>(s.QG, a.w.QG + ch * kC * D, tid);
    load_tile<kStateThreads, kC, kC, StateSmem<D, kBV>::ldp>(s.P, a.w.P + ch * kC * kC, tid);
    if (tid < D / 4) cp_async16(&s.eG[4 * tid], a.w.eGlast + ch * D + 4 * tid);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_one_pending() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

template <int D, int kBV>
__global__ void __launch_bounds__(kStateThreads, 2)
    kda_state_out_kernel(PassArgs a, int n_chunks, float* __restrict__ S, float* __restrict__ o) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using Smem = StateSmem<D, kBV>;
  auto& s = *reinterpret_cast<Smem*>(smem_raw);
  constexpr int ld = Smem::ld, ldv = Smem::ldv, ldp = Smem::ldp;
  // S's tiles: m-tile warp % kMT, and of its kNT n-tiles the group warp / kMT.
  constexpr int kMT = D / 16, kNT = kBV / 8, kWarpsPerM = kStateWarps / kMT, kSNT = kNT / kWarpsPerM;
  // V' and o ([kC, kBV]): m-tile warp % 4, n-tiles (warp / 4) * kCNT ...
  constexpr int kCNT = kNT / (kStateWarps / 4);
  static_assert(kStateWarps % kMT == 0 && kNT % kWarpsPerM == 0 && kSNT >= 1, "state: warps tile S");
  static_assert(kStateWarps % 4 == 0 && kCNT >= 2 && kCNT % 2 == 0, "state: warps tile V' and o");
  const int h = blockIdx.x, col0 = blockIdx.y * kBV, H = a.H;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int smt = warp % kMT, snt0 = (warp / kMT) * kSNT;  // this warp's S tiles
  const int cmt = warp & 3, cnt0 = (warp >> 2) * kCNT;     // this warp's V' and o tiles
  float* Sh = S + static_cast<int64_t>(h) * D * D;

  load_wu(a, s, 0, n_chunks, h, col0, tid);
  load_kgqp(a, s, 0, n_chunks, h, tid);
  float acc_s[kSNT][4];
#pragma unroll
  for (int nt = 0; nt < kSNT; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float2 v =
          *reinterpret_cast<const float2*>(Sh + (16 * smt + g + 8 * half) * D + col0 + 8 * (snt0 + nt) + 2 * t);
      acc_s[nt][2 * half] = v.x;
      acc_s[nt][2 * half + 1] = v.y;
    }

  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int t0 = chunk * kC, C = min(kC, a.T - t0);
#pragma unroll
    for (int nt = 0; nt < kSNT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<uint32_t*>(&s.Sb[16 * smt + g + 8 * half][8 * (snt0 + nt) + 2 * t]) =
            pack_bf16(acc_s[nt][2 * half], acc_s[nt][2 * half + 1]);
    cp_async_wait_one_pending();  // this chunk's W and U (the rest may still be in flight)
    __syncthreads();

    // V' = U - W S: rows 16 cmt .., columns 8 (cnt0 + n) ..
    {
      float acc_v[kCNT][4] = {};
      mma_rows<D>(acc_v, &s.W[0][0], ld, kSub * cmt, &s.Sb[0][0], ldv, cnt0, lane);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = kSub * cmt + g + 8 * half;
#pragma unroll
        for (int n = 0; n < kCNT; ++n) {
          const int x = 8 * (cnt0 + n) + 2 * t;  // rows past the end: U = W = 0, so 0
          *reinterpret_cast<uint32_t*>(&s.Vp[c][x]) =
              pack_bf16(__bfloat162float(s.U[c][x]) - acc_v[n][2 * half], __bfloat162float(s.U[c][x + 1]) - acc_v[n][2 * half + 1]);
        }
      }
    }
    __syncthreads();  // V' complete; W and U free
    load_wu(a, s, chunk + 1, n_chunks, h, col0, tid);
    cp_async_wait_one_pending();  // this chunk's KG, exp(G_last), QG and P
    __syncthreads();

    // o = QG S + P V' (P is lower triangular: k-tiles <= the row tile).
    {
      float acc_o[kCNT][4] = {};
      mma_rows<D>(acc_o, &s.QG[0][0], ld, kSub * cmt, &s.Sb[0][0], ldv, cnt0, lane);
#pragma unroll
      for (int kt = 0; kt < kC / kSub; ++kt) {
        if (kt > cmt) break;
        uint32_t ap[4];
        load_a(ap, &s.P[0][0], ldp, kSub * cmt, kSub * kt, lane);
#pragma unroll
        for (int n = 0; n < kCNT; n += 2) {
          uint32_t b[4];
          load_b2_trans(b, &s.Vp[0][0], ldv, kSub * kt, 8 * (cnt0 + n), lane);
          mma(acc_o[n], ap, b[0], b[1]);
          mma(acc_o[n + 1], ap, b[2], b[3]);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = kSub * cmt + g + 8 * half;
        if (c >= C) continue;
        float* orow = o + (static_cast<int64_t>(t0 + c) * H + h) * D + col0;
#pragma unroll
        for (int n = 0; n < kCNT; ++n)
          *reinterpret_cast<float2*>(orow + 8 * (cnt0 + n) + 2 * t) = make_float2(acc_o[n][2 * half], acc_o[n][2 * half + 1]);
      }
    }

    // S = Diag(exp(G_last)) S + KG^T V'.
    {
      const float e0 = s.eG[16 * smt + g], e1 = s.eG[16 * smt + g + 8];
#pragma unroll
      for (int nt = 0; nt < kSNT; ++nt) {
        acc_s[nt][0] *= e0;
        acc_s[nt][1] *= e0;
        acc_s[nt][2] *= e1;
        acc_s[nt][3] *= e1;
      }
#pragma unroll
      for (int kt = 0; kt < kC / 16; ++kt) {
        uint32_t ak[4];
        load_a_trans(ak, &s.KG[0][0], ld, 16 * smt, kSub * kt, lane);
#pragma unroll
        for (int n = 0; n < kSNT; n += 2) {
          uint32_t b[4];
          load_b2_trans(b, &s.Vp[0][0], ldv, kSub * kt, 8 * (snt0 + n), lane);
          mma(acc_s[n], ak, b[0], b[1]);
          if constexpr (kSNT % 2 == 0) mma(acc_s[n + 1], ak, b[2], b[3]);  // else columns past kBV: unused
        }
      }
    }
    __syncthreads();  // KG, eG, QG, P, Vp and Sb free
    load_kgqp(a, s, chunk + 1, n_chunks, h, tid);
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");

#pragma unroll
  for (int nt = 0; nt < kSNT; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<float2*>(Sh + (16 * smt + g + 8 * half) * D + col0 + 8 * (snt0 + nt) + 2 * t) =
          make_float2(acc_s[nt][2 * half], acc_s[nt][2 * half + 1]);
}

int64_t round_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

struct Sizes {
  int64_t rows_bf16, pairs, eg;
  Sizes(int n_tokens, int H, int D) {
    const int64_t chunks = std::min((n_tokens + kC - 1) / kC, kChunksPerPass);
    const int64_t Tp = chunks * kC;  // whole tiles
    rows_bf16 = round_up(Tp * H * D * 2);
    pairs = round_up(chunks * H * kC * kC * 2);
    eg = round_up(chunks * H * D * 4);
  }
  int64_t total() const { return 4 * rows_bf16 + pairs + eg; }
};

template <int D>
void run(const float* q, const float* k, const float* v, const float* g, const float* beta, int n_tokens, int H,
         float* S, float* o, void* workspace, cudaStream_t stream) {
  const Sizes sz(n_tokens, H, D);
  auto* p = static_cast<unsigned char*>(workspace);
  Workspace w;
  w.W = reinterpret_cast<bf16*>(p), p += sz.rows_bf16;
  w.QG = reinterpret_cast<bf16*>(p), p += sz.rows_bf16;
  w.KG = reinterpret_cast<bf16*>(p), p += sz.rows_bf16;
  w.U = reinterpret_cast<bf16*>(p), p += sz.rows_bf16;
  w.P = reinterpret_cast<bf16*>(p), p += sz.pairs;
  w.eGlast = reinterpret_cast<float*>(p);
  constexpr int kBV = kBVof<D>;
  allow_dynamic_smem(kda_prep_kernel<D>, sizeof(PrepSmem<D>));
  allow_dynamic_smem(kda_state_out_kernel<D, kBV>, sizeof(StateSmem<D, kBV>));
  for (int pass_t0 = 0; pass_t0 < n_tokens; pass_t0 += kChunksPerPass * kC) {
    const int T = std::min(n_tokens - pass_t0, kChunksPerPass * kC), n_chunks = (T + kC - 1) / kC;
    const int64_t off = static_cast<int64_t>(pass_t0) * H * D;
    const PassArgs args{q + off, k + off, v + off, g + off, beta + static_cast<int64_t>(pass_t0) * H, T, H, w};
    kda_prep_kernel<D><<<dim3(n_chunks, H), kPrepThreads, sizeof(PrepSmem<D>), stream>>>(args);
    CUDA_CHECK_LAUNCH();
    kda_state_out_kernel<D, kBV><<<dim3(H, D / kBV), kStateThreads, sizeof(StateSmem<D, kBV>), stream>>>(
        args, n_chunks, S, o + off);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

bool kda_chunked_mma_supported(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

int64_t kda_chunked_mma_workspace_bytes(int n_tokens, int num_heads, int head_dim) {
  return n_tokens <= 0 ? 0 : Sizes(n_tokens, num_heads, head_dim).total();
}

void kda_chunked_mma(const float* q, const float* k, const float* v, const float* g, const float* beta, int n_tokens,
                     int num_heads, int head_dim, float* S, float* o, void* workspace, cudaStream_t stream) {
  if (n_tokens <= 0 || num_heads <= 0) return;
  switch (head_dim) {
    case 32: return run<32>(q, k, v, g, beta, n_tokens, num_heads, S, o, workspace, stream);
    case 64: return run<64>(q, k, v, g, beta, n_tokens, num_heads, S, o, workspace, stream);
    case 128: return run<128>(q, k, v, g, beta, n_tokens, num_heads, S, o, workspace, stream);
    default: throw CudaError("kda_chunked_mma: head_dim " + std::to_string(head_dim) + " is not 32, 64 or 128");
  }
}

}  // namespace moonrun::cuda
