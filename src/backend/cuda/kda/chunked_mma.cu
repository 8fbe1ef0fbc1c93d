// The chunked (WY) form of the KDA recurrence on the tensor cores: the same algebra as
// chunked.cu (whose comment states it), with bf16 operands and fp32 accumulation, in three
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
//    - (I + L)^-1 in fp32: the 16x16 diagonal blocks by substitution, then the bands below;
//    - W = T (exp(G) k) and U = T v as MMAs, T = (I + L)^-1 Diag(beta) rounded to bf16;
//    - the rows the later kernels read: QG = q exp(G), KG = k exp(G_last - G), exp(G_last).
// 2. state, one block per (head, 64 v-columns), the chunks in order: S [D, 64] stays in the
//    MMA accumulators of its four warps (fp32); per chunk it goes out as bf16 (Sc), then
//    V' = U - W S (out as bf16) and S = Diag(exp(G_last)) S + KG^T V'. Only this walk is
//    sequential, so it carries nothing else; the next chunk's tiles load during this one.
// 3. out, one block per (chunk, head), all chunks at once: o = QG Sc + P V'.
//
// Exponentials are __expf (ex2.approx): every argument is <= 0 and every result is rounded
// to bf16 or multiplies an fp32 state whose own rounding is larger.
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
constexpr int kThreads = 128;       // state and out kernels: four warps, one 16-row tile of the chunk each
constexpr int kPrepThreads = 256;   // prep kernel: eight warps (one block fills a multiprocessor's shared memory)
constexpr int kChunksPerPass = 16;  // bounds the workspace (1,024 tokens a pass)
// State kernel: v-columns per block. K3 (96 heads of 128) gives 192 blocks, two a multiprocessor
// at most: every block of the pass is resident at once, with no second wave.
template <int D>
constexpr int kBVof = D < 64 ? D : 64;
constexpr int kKtRows = 96;         // the three reference-scaled key blocks: 16 + 32 + 48 rows

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

// A fragment (16 x 16 at m0, k0) of a row-major [m][k] tile.
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16* base, int ld, int m0, int k0, int lane) {
  const bf16* p = base + (m0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
  a[0] = bf16_pair(p);
  a[1] = bf16_pair(p + 8 * ld);
  a[2] = bf16_pair(p + 8);
  a[3] = bf16_pair(p + 8 * ld + 8);
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


// One pass's temporaries (token rows [T, H, D] as the inputs; chunk rows [chunks, H, ...]).
struct Workspace {
  bf16 *W, *QG, *KG;  // WY rows, q exp(G), k exp(G_last - G)
  float* U;           // WY rows of v (fp32: only ever an addend)
  bf16* P;            // [chunks, H, kC, kC]: the q-k pair matrix, lower triangle with diagonal
  float* eGlast;      // [chunks, H, D]
  bf16* Vp;           // [T, H, D]: V' = U - W S (the state kernel's)
  bf16* Sc;           // [chunks, H, D, D]: S at each chunk's start (the state kernel's)
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
  float G[kC][D];                   // g, then its in-chunk cumulative sum
  float q[kC][D], k[kC][D], v[kC][D];
  float A[kC][kC + 1];  // N = -L, strictly lower
  float beta[kC];
  union {
    struct {
      bf16 Ks[kC][ld], Qs[kC][ld];  // k, q exp(G_c - G_r), r = c's sub-chunk's first row
      bf16 Kt[kKtRows][ld];         // for I = 1..3: k_j exp(G_{16I} - G_j), j < 16I, at row 8I(I-1)
    } pairs;
    struct {
      bf16 T[kC][kC + 8];  // (I + L)^-1 Diag(beta)
      bf16 ek[kC][ld], v[kC][ld];
      float Minv[kC][kC + 1];  // (I + L)^-1, lower triangle with diagonal
    } wy;
  } u;
};

// One block per (chunk, head), kPrepThreads threads. The chunk's q, k, v, g come into shared
// memory first, all copies in flight together; everything after reads shared memory only,
// so no global load waits behind a global store.
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
  //    nothing, and G_last = G[kC - 1]).
  for (int e = tid; e < kC * D / 4; e += kPrepThreads) {
    const int c = e / (D / 4), x = (e % (D / 4)) * 4;
    if (c < C) {
      const int64_t at = row(c) + x;
      cp_async16(&s.G[c][x], a.g + at);
      cp_async16(&s.q[c][x], a.q + at);
      cp_async16(&s.k[c][x], a.k + at);
      cp_async16(&s.v[c][x], a.v + at);
    } else {
      const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      *reinterpret_cast<float4*>(&s.G[c][x]) = z;
      *reinterpret_cast<float4*>(&s.q[c][x]) = z;
      *reinterpret_cast<float4*>(&s.k[c][x]) = z;
      *reinterpret_cast<float4*>(&s.v[c][x]) = z;
    }
  }
  if (tid < kC) s.beta[tid] = tid < C ? a.beta[static_cast<int64_t>(t0 + tid) * H + h] : 0.0f;
  cp_async_wait_all();
  __syncthreads();
  for (int x = tid; x < D; x += kPrepThreads) {
    float G = 0.0f;
    for (int c = 0; c < kC; ++c) s.G[c][x] = G = s.G[c][x] + G;
    a.w.eGlast[(static_cast<int64_t>(chunk) * H + h) * D + x] = __expf(G);
  }
  __syncthreads();

  // 2. The scaled rows: Qs, Ks and Kt here; QG and KG out to the workspace.
  for (int e = tid; e < kC * D / 2; e += kPrepThreads) {
    const int c = e / (D / 2), x = (e % (D / 2)) * 2, r = c & ~(kSub - 1);
    const float2 qv = *reinterpret_cast<const float2*>(&s.q[c][x]), kv = *reinterpret_cast<const float2*>(&s.k[c][x]);
    const float G0 = s.G[c][x], G1 = s.G[c][x + 1];
    const float e0 = __expf(G0 - s.G[r][x]), e1 = __expf(G1 - s.G[r][x + 1]);
    *reinterpret_cast<uint32_t*>(&s.u.pairs.Qs[c][x]) = pack_bf16(qv.x * e0, qv.y * e1);
    *reinterpret_cast<uint32_t*>(&s.u.pairs.Ks[c][x]) = pack_bf16(kv.x * e0, kv.y * e1);
    if (c < C) {
      *reinterpret_cast<uint32_t*>(a.w.QG + row(c) + x) = pack_bf16(qv.x * __expf(G0), qv.y * __expf(G1));
      *reinterpret_cast<uint32_t*>(a.w.KG + row(c) + x) =
          pack_bf16(kv.x * __expf(s.G[kC - 1][x] - G0), kv.y * __expf(s.G[kC - 1][x + 1] - G1));
    }
  }
  for (int e = tid; e < kKtRows * D / 2; e += kPrepThreads) {
    const int rr = e / (D / 2), x = (e % (D / 2)) * 2;
    const int I = rr < 16 ? 1 : rr < 48 ? 2 : 3, j = rr - 8 * I * (I - 1), r = kSub * I;
    *reinterpret_cast<uint32_t*>(&s.u.pairs.Kt[rr][x]) = pack_bf16(s.k[j][x] * __expf(s.G[r][x] - s.G[j][x]),
                                                                  s.k[j][x + 1] * __expf(s.G[r][x + 1] - s.G[j][x + 1]));
  }
  __syncthreads();

  bf16* Pg = a.w.P + (static_cast<int64_t>(chunk) * H + h) * kC * kC;
  // 3. The six blocks below the diagonal, for L and for P: twelve 16x16 products.
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
  // 4. The diagonal blocks in fp32: warp w takes sub-chunk w % 4, half its rows. Lane l holds
  //    x = l + 32r of row c and accumulates the row's 16 pairs (c, j) for L and for P (those
  //    above the diagonal are computed and dropped: no data-dependent loop bounds); one
  //    transposing reduction then leaves pair value v in lane v (31 shuffles for 32 sums).
  {
    constexpr int kPerLane = D / 32, kRowsPerWarp = kSub * 4 / kWarps;
    const int c0 = kSub * (warp & 3);
    for (int c = c0 + kRowsPerWarp * (warp >> 2); c < c0 + kRowsPerWarp * ((warp >> 2) + 1); ++c) {
      float qc[kPerLane], kc[kPerLane], Gc[kPerLane];
#pragma unroll
      for (int r = 0; r < kPerLane; ++r) {
        qc[r] = s.q[c][lane + 32 * r];
        kc[r] = s.k[c][lane + 32 * r];
        Gc[r] = s.G[c][lane + 32 * r];
      }
      float part[32];  // [0, 16): L's sums of (c, c0 + i); [16, 32): P's
#pragma unroll
      for (int i = 0; i < kSub; ++i) {
        const int j = c0 + i;
        float lk = 0.0f, lq = 0.0f;
#pragma unroll
        for (int r = 0; r < kPerLane; ++r) {
          const int x = lane + 32 * r;
          const float kj = s.k[j][x] * __expf(fminf(Gc[r] - s.G[j][x], 0.0f));  // j <= c: exponent <= 0
          lk += kc[r] * kj;
          lq += qc[r] * kj;
        }
        part[i] = lk;
        part[kSub + i] = lq;
      }
#pragma unroll
      for (int level = 0; level < 5; ++level) {  // keep the half named by this lane's bit
        const int off = 16 >> level;
        const bool upper = lane & off;
#pragma unroll
        for (int i = 0; i < 16; ++i) {  // constant bounds, so `part` stays in registers
          if (i >= off) continue;
          const float lo = part[i], hi = part[i + off];  // values first: a select of two
          part[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, off);  // addresses spills
        }
      }
      const int j = c0 + (lane & (kSub - 1));  // lane holds the sum of value `lane`
      if (lane < kSub) {
        if (j < c) s.A[c][j] = -s.beta[c] * part[0];
      } else {
        Pg[c * kC + j] = __float2bfloat16_rn(j <= c ? part[0] : 0.0f);  // zero above the diagonal
      }
    }
  }
  __syncthreads();

  // 5. Minv = (I + L)^-1 = (I - N)^-1. The diagonal 16x16 blocks first: warp w < 4's lane
  //    q < 16 walks down column q of block w (Minv = I + N Minv, row by row: no other lane's
  //    values needed). Then the blocks below them, one band at a time:
  //    Minv_ij = Minv_ii sum_{j<=m<i} N_im Minv_mj (the Minv_mj are from earlier bands).
  auto& M = s.u.wy.Minv;
  if (warp < 4 && lane < kSub) {
    const int b0 = kSub * warp, q = lane;
    float col[kSub];
#pragma unroll
    for (int r = 0; r < kSub; ++r) {
      float acc = 0.0f;
#pragma unroll
      for (int m = 0; m < r; ++m) acc += s.A[b0 + r][b0 + m] * col[m];
      col[r] = r == q ? 1.0f : r > q ? acc : 0.0f;
      M[b0 + r][b0 + q] = col[r];
    }
  }
  __syncthreads();
  constexpr int kBandPerThread = 3 * kSub * kSub / kPrepThreads;
  for (int band = 1; band < 4; ++band) {
    const int n_el = (4 - band) * kSub * kSub;  // blocks (j + band, j), j = 0 .. 3 - band
    float y[kBandPerThread];
#pragma unroll
    for (int n = 0; n < kBandPerThread; ++n) {
      const int e = tid + kPrepThreads * n;
      y[n] = 0.0f;
      if (e >= n_el) continue;
      const int j = e / (kSub * kSub), i = j + band, r = (e / kSub) % kSub, q = e % kSub;
      float acc = 0.0f;
      for (int m = kSub * j; m < kSub * i; ++m) acc += s.A[kSub * i + r][m] * M[m][kSub * j + q];
      y[n] = acc;
    }
#pragma unroll
    for (int n = 0; n < kBandPerThread; ++n) {  // block (i, j) is read by no one in this band
      const int e = tid + kPrepThreads * n;
      if (e < n_el) M[kSub * (e / (kSub * kSub) + band) + (e / kSub) % kSub][kSub * (e / (kSub * kSub)) + e % kSub] = y[n];
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kBandPerThread; ++n) {
      const int e = tid + kPrepThreads * n;
      if (e >= n_el) continue;
      const int j = e / (kSub * kSub), i = j + band, r = (e / kSub) % kSub, q = e % kSub;
      float acc = 0.0f;
#pragma unroll
      for (int m = 0; m < kSub; ++m) acc += M[kSub * i + r][kSub * i + m] * M[kSub * i + m][kSub * j + q];
      y[n] = acc;
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kBandPerThread; ++n) {
      const int e = tid + kPrepThreads * n;
      if (e < n_el) M[kSub * (e / (kSub * kSub) + band) + (e / kSub) % kSub][kSub * (e / (kSub * kSub)) + e % kSub] = y[n];
    }
    __syncthreads();
  }

  // 6. T = Minv Diag(beta), then (Minv is dead) exp(G) k and v as bf16 operands.
  for (int e = tid; e < kC * kC / 2; e += kPrepThreads) {
    const int c = e / (kC / 2), j = (e % (kC / 2)) * 2;
    auto tval = [&](int jj) { return jj <= c ? M[c][jj] * s.beta[jj] : 0.0f; };
    *reinterpret_cast<uint32_t*>(&s.u.wy.T[c][j]) = pack_bf16(tval(j), tval(j + 1));
  }
  for (int e = tid; e < kC * D / 2; e += kPrepThreads) {
    const int c = e / (D / 2), x = (e % (D / 2)) * 2;
    *reinterpret_cast<uint32_t*>(&s.u.wy.ek[c][x]) =
        pack_bf16(s.k[c][x] * __expf(s.G[c][x]), s.k[c][x + 1] * __expf(s.G[c][x + 1]));
    *reinterpret_cast<uint32_t*>(&s.u.wy.v[c][x]) = pack_bf16(s.v[c][x], s.v[c][x + 1]);
  }
  __syncthreads();

  // 7. W = T ek (warps 0-3) and U = T v (warps 4-7), 16 rows a warp; T is lower
  //    triangular, so k-tiles <= the row tile.
  {
    const int which = warp >> 2, mt = warp & 3;
    const bf16* Bm = which ? &s.u.wy.v[0][0] : &s.u.wy.ek[0][0];
#pragma unroll 2
    for (int n0 = 0; n0 < D; n0 += 16) {
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
        if (c >= C) continue;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const int x = n0 + 8 * n + 2 * t;
          if (which)
            *reinterpret_cast<float2*>(a.w.U + row(c) + x) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
          else
            *reinterpret_cast<uint32_t*>(a.w.W + row(c) + x) = pack_bf16(acc[n][2 * half], acc[n][2 * half + 1]);
        }
      }
    }
  }
}

template <int D>
struct StateSmem {
  static constexpr int kBV = kBVof<D>;
  static constexpr int ld = D + 8, ldv = kBV + 8;
  bf16 W[kC][ld], KG[kC][ld];
  float U[kC][kBV];
  float eG[D];
  bf16 Sb[D][ldv];  // S as bf16, the B operand of W S
  bf16 Vp[kC][ldv];
};

// The copies of chunk `chunk`'s W and U rows (one commit group), or of its KG rows and
// exp(G_last) (another); rows past the end are zeros. Called with chunk == n_chunks, they
// commit an empty group, so the wait counts stay the same on the last chunk.
template <int D>
__device__ __forceinline__ void load_wu(const PassArgs& a, StateSmem<D>& s, int chunk, int n_chunks, int h,
                                        int col0, int tid) {
  if (chunk < n_chunks) {
    const int t0 = chunk * kC, C = min(kC, a.T - t0);
    for (int e = tid; e < kC * D / 8; e += kThreads) {
      const int c = e / (D / 8), x = (e % (D / 8)) * 8;
      if (c < C) cp_async16(&s.W[c][x], a.w.W + (static_cast<int64_t>(t0 + c) * a.H + h) * D + x);
      else *reinterpret_cast<uint4*>(&s.W[c][x]) = make_uint4(0, 0, 0, 0);
    }
    constexpr int kBV = kBVof<D>;
    for (int e = tid; e < kC * kBV / 4; e += kThreads) {
      const int c = e / (kBV / 4), x = (e % (kBV / 4)) * 4;
      if (c < C) cp_async16(&s.U[c][x], a.w.U + (static_cast<int64_t>(t0 + c) * a.H + h) * D + col0 + x);
      else *reinterpret_cast<float4*>(&s.U[c][x]) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int D>
__device__ __forceinline__ void load_kg(const PassArgs& a, StateSmem<D>& s, int chunk, int n_chunks, int h, int tid) {
  if (chunk < n_chunks) {
    const int t0 = chunk * kC, C = min(kC, a.T - t0);
    for (int e = tid; e < kC * D / 8; e += kThreads) {
      const int c = e / (D / 8), x = (e % (D / 8)) * 8;
      if (c < C) cp_async16(&s.KG[c][x], a.w.KG + (static_cast<int64_t>(t0 + c) * a.H + h) * D + x);
      else *reinterpret_cast<uint4*>(&s.KG[c][x]) = make_uint4(0, 0, 0, 0);
    }
    for (int e = tid; e < D / 4; e += kThreads)
      cp_async16(&s.eG[4 * e], a.w.eGlast + (static_cast<int64_t>(chunk) * a.H + h) * D + 4 * e);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_one_pending() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// The chunks in order for one (head, 64 v-columns): per chunk, S at its start goes out as
// bf16 (Sc, for the output kernel), V' = U - W S goes out as bf16 (Vp), and
// S = Diag(exp(G_last)) S + KG^T V'. Every global read is a cp.async issued half a chunk
// ahead: the next W and U once this chunk's V' is done, the next KG once its S is.
template <int D>
__global__ void __launch_bounds__(kThreads) kda_state_kernel(PassArgs a, int n_chunks, float* __restrict__ S) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& s = *reinterpret_cast<StateSmem<D>*>(smem_raw);
  constexpr int ld = StateSmem<D>::ld, ldv = StateSmem<D>::ldv, kBV = kBVof<D>;
  constexpr int kMT = D / 16, kMTPerWarp = (kMT + 3) / 4, kNT = kBV / 8;
  const int h = blockIdx.x, col0 = blockIdx.y * kBV, H = a.H;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  float* Sh = S + static_cast<int64_t>(h) * D * D;

  load_wu<D>(a, s, 0, n_chunks, h, col0, tid);
  load_kg<D>(a, s, 0, n_chunks, h, tid);
  // S rows of m-tile warp + 4 i, columns col0 + 8 nt + 2t (+1), in the accumulator layout.
  float acc_s[kMTPerWarp][kNT][4];
#pragma unroll
  for (int i = 0; i < kMTPerWarp; ++i) {
    const int mt = warp + 4 * i;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 v = mt < kMT ? *reinterpret_cast<const float2*>(Sh + (16 * mt + g + 8 * half) * D + col0 +
                                                                     8 * nt + 2 * t)
                                  : make_float2(0.0f, 0.0f);
        acc_s[i][nt][2 * half] = v.x;
        acc_s[i][nt][2 * half + 1] = v.y;
      }
  }

  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int t0 = chunk * kC, C = min(kC, a.T - t0);
    // S at the chunk's start: to shared memory (bf16) and to Sc for the output kernel.
    bf16* Sc = a.w.Sc + ((static_cast<int64_t>(chunk) * H + h) * D) * D + col0;
#pragma unroll
    for (int i = 0; i < kMTPerWarp; ++i) {
      const int mt = warp + 4 * i;
      if (mt >= kMT) continue;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int x = 16 * mt + g + 8 * half, col = 8 * nt + 2 * t;
          const uint32_t v = pack_bf16(acc_s[i][nt][2 * half], acc_s[i][nt][2 * half + 1]);
          *reinterpret_cast<uint32_t*>(&s.Sb[x][col]) = v;
          *reinterpret_cast<uint32_t*>(Sc + x * D + col) = v;
        }
    }
    cp_async_wait_one_pending();  // this chunk's W and U (its KG may still be in flight)
    __syncthreads();

    // V' = U - W S for rows 16 warp .. + 15.
    float acc_v[kNT][4] = {};
#pragma unroll 4
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t aw[4];
      load_a(aw, &s.W[0][0], ld, kSub * warp, k0, lane);
#pragma unroll
      for (int n0 = 0; n0 < kBV; n0 += 16) {
        uint32_t b[4];
        load_b2_trans(b, &s.Sb[0][0], ldv, k0, n0, lane);
        mma(acc_v[n0 / 8], aw, b[0], b[1]);
        mma(acc_v[n0 / 8 + 1], aw, b[2], b[3]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c = kSub * warp + g + 8 * half;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int x = 8 * nt + 2 * t;
        const uint32_t vp = pack_bf16(s.U[c][x] - acc_v[nt][2 * half], s.U[c][x + 1] - acc_v[nt][2 * half + 1]);
        if (c < C) *reinterpret_cast<uint32_t*>(a.w.Vp + (static_cast<int64_t>(t0 + c) * H + h) * D + col0 + x) = vp;
        *reinterpret_cast<uint32_t*>(&s.Vp[c][x]) = vp;  // rows past the end: U = W = 0, so 0
      }
    }
    __syncthreads();  // V' complete; W and U free
    load_wu<D>(a, s, chunk + 1, n_chunks, h, col0, tid);
    cp_async_wait_one_pending();  // this chunk's KG
    __syncthreads();

    // S = Diag(exp(G_last)) S + KG^T V'.
#pragma unroll
    for (int i = 0; i < kMTPerWarp; ++i) {
      const int mt = warp + 4 * i;
      if (mt >= kMT) continue;
      const float e0 = s.eG[16 * mt + g], e1 = s.eG[16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        acc_s[i][nt][0] *= e0;
        acc_s[i][nt][1] *= e0;
        acc_s[i][nt][2] *= e1;
        acc_s[i][nt][3] *= e1;
      }
#pragma unroll
      for (int kt = 0; kt < kC / 16; ++kt) {
        uint32_t ak[4];
        load_a_trans(ak, &s.KG[0][0], ld, 16 * mt, kSub * kt, lane);
#pragma unroll
        for (int n0 = 0; n0 < kBV; n0 += 16) {
          uint32_t b[4];
          load_b2_trans(b, &s.Vp[0][0], ldv, kSub * kt, n0, lane);
          mma(acc_s[i][n0 / 8], ak, b[0], b[1]);
          mma(acc_s[i][n0 / 8 + 1], ak, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // KG, eG, Vp and Sb free
    load_kg<D>(a, s, chunk + 1, n_chunks, h, tid);
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");

#pragma unroll
  for (int i = 0; i < kMTPerWarp; ++i) {
    const int mt = warp + 4 * i;
    if (mt >= kMT) continue;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<float2*>(Sh + (16 * mt + g + 8 * half) * D + col0 + 8 * nt + 2 * t) =
            make_float2(acc_s[i][nt][2 * half], acc_s[i][nt][2 * half + 1]);
  }
}

template <int D>
struct OutSmem {
  static constexpr int ld = D + 8, ldp = kC + 8;
  bf16 QG[kC][ld], Vp[kC][ld], Sc[D][ld];
  bf16 P[kC][ldp];
};

// o = QG Sc + P V' for one (chunk, head): every chunk at once, from what the state kernel
// left. Warp w: rows 16w .. 16w + 15, all D columns, 32 at a time.
template <int D>
__global__ void __launch_bounds__(kThreads) kda_out_kernel(PassArgs a, float* __restrict__ o) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& s = *reinterpret_cast<OutSmem<D>*>(smem_raw);
  constexpr int ld = OutSmem<D>::ld, ldp = OutSmem<D>::ldp;
  const ChunkOfHead<D> ch(a);
  const int chunk = ch.chunk, h = ch.h, H = ch.H, C = ch.C;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  auto row = [&](int c) { return ch.row(c); };
  for (int e = tid; e < kC * D / 8; e += kThreads) {
    const int c = e / (D / 8), x = (e % (D / 8)) * 8;
    if (c < C) {
      cp_async16(&s.QG[c][x], a.w.QG + row(c) + x);
      cp_async16(&s.Vp[c][x], a.w.Vp + row(c) + x);
    } else {
      *reinterpret_cast<uint4*>(&s.QG[c][x]) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(&s.Vp[c][x]) = make_uint4(0, 0, 0, 0);
    }
  }
  const bf16* Sc = a.w.Sc + (static_cast<int64_t>(chunk) * H + h) * D * D;
  for (int e = tid; e < D * D / 8; e += kThreads) {
    const int x = e / (D / 8), y = (e % (D / 8)) * 8;
    cp_async16(&s.Sc[x][y], Sc + x * D + y);
  }
  const bf16* Pg = a.w.P + (static_cast<int64_t>(chunk) * H + h) * kC * kC;
  for (int e = tid; e < kC * kC / 8; e += kThreads) {
    const int c = e / (kC / 8), x = (e % (kC / 8)) * 8;
    cp_async16(&s.P[c][x], Pg + c * kC + x);
  }
  cp_async_wait_all();
  __syncthreads();
  const int c_lo = kSub * warp + g;
  for (int n_base = 0; n_base < D; n_base += 32) {
    float acc[4][4] = {};
#pragma unroll 4
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t aq[4], b[4];
      load_a(aq, &s.QG[0][0], ld, kSub * warp, k0, lane);
#pragma unroll
      for (int n0 = 0; n0 < 32; n0 += 16) {
        load_b2_trans(b, &s.Sc[0][0], ld, k0, n_base + n0, lane);
        mma(acc[n0 / 8], aq, b[0], b[1]);
        mma(acc[n0 / 8 + 1], aq, b[2], b[3]);
      }
    }
    for (int kt = 0; kt <= warp; ++kt) {  // P is lower triangular
      uint32_t ap[4], b[4];
      load_a(ap, &s.P[0][0], ldp, kSub * warp, kSub * kt, lane);
#pragma unroll
      for (int n0 = 0; n0 < 32; n0 += 16) {
        load_b2_trans(b, &s.Vp[0][0], ld, kSub * kt, n_base + n0, lane);
        mma(acc[n0 / 8], ap, b[0], b[1]);
        mma(acc[n0 / 8 + 1], ap, b[2], b[3]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c = c_lo + 8 * half;
      if (c >= C) continue;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        *reinterpret_cast<float2*>(o + row(c) + n_base + 8 * nt + 2 * t) =
            make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]);
    }
  }
}

int64_t round_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

struct Sizes {
  int64_t rows_bf16, rows_f32, pairs, eg, states;
  Sizes(int n_tokens, int H, int D) {
    const int64_t chunks = std::min((n_tokens + kC - 1) / kC, kChunksPerPass);
    const int64_t Tp = std::min<int64_t>(n_tokens, chunks * kC);
    rows_bf16 = round_up(Tp * H * D * 2);
    rows_f32 = round_up(Tp * H * D * 4);
    pairs = round_up(chunks * H * kC * kC * 2);
    eg = round_up(chunks * H * D * 4);
    states = round_up(chunks * H * D * D * 2);
  }
  int64_t total() const { return 4 * rows_bf16 + rows_f32 + pairs + eg + states; }
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
  w.U = reinterpret_cast<float*>(p), p += sz.rows_f32;
  w.P = reinterpret_cast<bf16*>(p), p += sz.pairs;
  w.eGlast = reinterpret_cast<float*>(p), p += sz.eg;
  w.Vp = reinterpret_cast<bf16*>(p), p += sz.rows_bf16;
  w.Sc = reinterpret_cast<bf16*>(p);
  allow_dynamic_smem(kda_prep_kernel<D>, sizeof(PrepSmem<D>));
  allow_dynamic_smem(kda_state_kernel<D>, sizeof(StateSmem<D>));
  allow_dynamic_smem(kda_out_kernel<D>, sizeof(OutSmem<D>));
  for (int pass_t0 = 0; pass_t0 < n_tokens; pass_t0 += kChunksPerPass * kC) {
    const int T = std::min(n_tokens - pass_t0, kChunksPerPass * kC), n_chunks = (T + kC - 1) / kC;
    const int64_t off = static_cast<int64_t>(pass_t0) * H * D;
    const PassArgs args{q + off, k + off, v + off, g + off, beta + static_cast<int64_t>(pass_t0) * H, T, H, w};
    kda_prep_kernel<D><<<dim3(n_chunks, H), kPrepThreads, sizeof(PrepSmem<D>), stream>>>(args);
    CUDA_CHECK_LAUNCH();
    kda_state_kernel<D><<<dim3(H, D / kBVof<D>), kThreads, sizeof(StateSmem<D>), stream>>>(args, n_chunks, S);
    CUDA_CHECK_LAUNCH();
    kda_out_kernel<D><<<dim3(n_chunks, H), kThreads, sizeof(OutSmem<D>), stream>>>(args, o + off);
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
