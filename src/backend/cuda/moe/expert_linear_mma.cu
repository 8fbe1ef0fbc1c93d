// The MXFP4 routed-expert GEMM on the tensor cores (W4A16, Hopper has no FP4
// MMA): the same y[s, o] = sum_i x[s / x_row_div, i] * W_e[o, i] as
// expert_linear.cu's CUDA-core kernel, for bf16 activations and MXFP4 weights
// with in % 64 == 0 and out % 16 == 0 (every K3 expert shape). The CUDA-core
// kernel stays the reference beside it and takes every other shape.
//
// Layout of the work. A block of 4 warps owns 16 output rows of one active expert (grid x:
// the expert, y: the row tile) - the A operand (M = 16) of mma.sync.m16n8k16 (bf16 in, fp32
// accumulate) - and splits the reduction dimension over its warps: warp w takes the 64-wide
// k-slices w, w + 4, ...; the four partial tiles are summed in shared memory in warp order,
// so the result is the same on every run. The expert's tokens are the N side, in tiles of 8,
// 16 or 32 (one, two or four n8 fragments: up to 8 tokens in the batch, up to 256, more).
//
// The MMA's k positions are a permutation of the slice's: thread t (= lane % 4) feeds MMA k
// 2t, 2t + 1, 2t + 8, 2t + 9 of step s from the slice's k 16t + 4s + 0..3, the same in A and
// B, so the sum is unchanged and every thread's operands are contiguous: the code bytes
// 8t .. 8t + 7 of its two rows (g = lane / 4 and g + 8), one 8-byte load each, and x[16t ..
// 16t + 15] of its token, two 16-byte loads - no shared-memory staging, no barrier in the
// loop. The next slice's loads are issued before the current slice's MMAs. The codes are
// re-laid at load so each bf16 pair of them comes out of a word by a shift and a mask
// (mxfp4_rows.cuh, mxfp4_pairs.h), then is multiplied by the group's E8M0 scale as a bf16
// power of two: exact (a code has two significant bits), so the products the MMA
// accumulates in fp32 are the CPU's code * scale * x products; only the summation order
// differs. Weights are read once per token tile: once per step at decode batch sizes.
//
// INT4 (kInt4, Kind::int4_pairs: words re-laid at load, int4_pairs.h): the same loads of the
// same bytes (a word of eight u4 is four bytes of E2M1 codes), the rows' bf16 scales of a
// slice as one 32-bit word, x at the k thread t's re-laid words hold (8t .. 8t + 7, then
// 32 + 8t .. 32 + 8t + 7); each group's two MMA steps sum x * q into zeroed fragments, which
// are scaled in fp32 and added (mxfp4_rows.cuh, namespace int4): the CPU's weights q * scale
// exactly, only the summation order differs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/moe/moe_ops.h"
#include "backend/cuda/moe/mxfp4_rows.cuh"

namespace moonrun::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRows = 16;   // per block: one m16 tile
constexpr int kSlice = 64;  // k per warp iteration: two MXFP4 scale groups

// What one thread loads for one k-slice: its 8 code bytes of rows g and g + 8, their scales,
// and x[16t .. 16t + 15] of each token fragment's token g. kFrags n8 fragments make a token
// tile of 8 kFrags: 1 at small decode batches (few registers, many warps in flight to keep
// the weight loads going), 4 for prefill.
template <int kFrags>
struct SliceLoads {
  uint2 code_a, code_b;
  uint32_t scale_a, scale_b;  // MXFP4: the E8M0 byte; INT4: the slice's two bf16 scales
  uint4 x[kFrags][2];
};

template <bool kInt4, int kFrags>
__device__ __forceinline__ void load_slice(SliceLoads<kFrags>& L, const uint8_t* codes_a, const uint8_t* codes_b,
                                           const uint8_t* scales_a, const uint8_t* scales_b, const bf16* const* x_rows,
                                           int n_frags, int k0, int t) {
  L.code_a = __ldg(reinterpret_cast<const uint2*>(codes_a + k0 / 2 + 8 * t));
  L.code_b = __ldg(reinterpret_cast<const uint2*>(codes_b + k0 / 2 + 8 * t));
  if constexpr (kInt4) {
    // Groups k0 / 32 and k0 / 32 + 1: bf16 scales, bytes 2 k0 / 32 .. + 3 of the row.
    L.scale_a = __ldg(reinterpret_cast<const uint32_t*>(scales_a + k0 / 16));
    L.scale_b = __ldg(reinterpret_cast<const uint32_t*>(scales_b + k0 / 16));
  } else {
    // k 16t .. 16t + 15 lies in scale group k0 / 32 + t / 2.
    L.scale_a = __ldg(scales_a + k0 / 32 + t / 2);
    L.scale_b = __ldg(scales_b + k0 / 32 + t / 2);
  }
  // INT4: thread t's k are 8t .. 8t + 7 and 32 + 8t .. 32 + 8t + 7 (int4_pairs.h).
  const int x0 = kInt4 ? 8 * t : 16 * t, x1 = kInt4 ? 32 + 8 * t : 16 * t + 8;
#pragma unroll
  for (int f = 0; f < kFrags; ++f) {
    if (f < n_frags && x_rows[f] != nullptr) {
      L.x[f][0] = __ldg(reinterpret_cast<const uint4*>(x_rows[f] + k0 + x0));
      L.x[f][1] = __ldg(reinterpret_cast<const uint4*>(x_rows[f] + k0 + x1));
    } else {
      L.x[f][0] = L.x[f][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// The four MMA steps of one slice: step s takes k 16t + 4s .. + 3 - pairs 2(s % 2) and
// 2(s % 2) + 1 of code word s / 2 (mxfp4_rows.cuh), x words 2s and 2s + 1 of the eight.
template <bool kTwoStep, int kFrags>
__device__ __forceinline__ void slice_mmas(const SliceLoads<kFrags>& cur, int n_frags, float acc[kFrags][4]) {
  const uint32_t fa = mxfp4::scale_factor<kTwoStep>(cur.scale_a), fb = mxfp4::scale_factor<kTwoStep>(cur.scale_b);
  const uint32_t wa[2] = {cur.code_a.x, cur.code_a.y}, wb[2] = {cur.code_b.x, cur.code_b.y};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    uint32_t a[4];
    if (s % 2 == 0)
      mxfp4::a_operands<kTwoStep, 0>(wa[s / 2], wb[s / 2], fa, fb, a);
    else
      mxfp4::a_operands<kTwoStep, 1>(wa[s / 2], wb[s / 2], fa, fb, a);
#pragma unroll
    for (int f = 0; f < kFrags; ++f) {
      if (f >= n_frags) break;  // uniform over the warp
      const uint4 xv = cur.x[f][s / 2];
      const uint32_t b0 = s % 2 == 0 ? xv.x : xv.z, b1 = s % 2 == 0 ? xv.y : xv.w;
      mma_m16n8k16_bf16(acc[f], a[0], a[1], a[2], a[3], b0, b1);
    }
  }
}

// The INT4 twin of slice_mmas: step s takes group s / 2 (word s / 2 of the thread's two), half
// s % 2, x words 2s and 2s + 1 as there; each group's sums are scaled into acc in fp32.
template <int kFrags>
__device__ __forceinline__ void slice_mmas_int4(const SliceLoads<kFrags>& cur, int n_frags, float acc[kFrags][4]) {
  const uint32_t wa[2] = {cur.code_a.x, cur.code_a.y}, wb[2] = {cur.code_b.x, cur.code_b.y};
  const float sa[2] = {int4::scale_lo(cur.scale_a), int4::scale_hi(cur.scale_a)};
  const float sb[2] = {int4::scale_lo(cur.scale_b), int4::scale_hi(cur.scale_b)};
#pragma unroll
  for (int G = 0; G < 2; ++G) {
    float part[kFrags][4];
#pragma unroll
    for (int f = 0; f < kFrags; ++f) part[f][0] = part[f][1] = part[f][2] = part[f][3] = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t a[4];
      if (h == 0)
        int4::a_operands<0>(wa[G], wb[G], a);
      else
        int4::a_operands<1>(wa[G], wb[G], a);
#pragma unroll
      for (int f = 0; f < kFrags; ++f) {
        if (f >= n_frags) break;  // uniform over the warp
        const uint4 xv = cur.x[f][G];
        const uint32_t b0 = h == 0 ? xv.x : xv.z, b1 = h == 0 ? xv.y : xv.w;
        mma_m16n8k16_bf16(part[f], a[0], a[1], a[2], a[3], b0, b1);
      }
    }
#pragma unroll
    for (int f = 0; f < kFrags; ++f) {
      if (f >= n_frags) break;
      int4::add_scaled(part[f], sa[G], sb[G], acc[f]);
    }
  }
}

// grid (active experts bound, out / 16), kWarps * 32 threads.
template <bool kInt4, int kFrags>
__global__ void __launch_bounds__(kWarps * 32)
    grouped_mxfp4_mma_kernel(const bf16* __restrict__ x, int x_row_div, StackedExperts m, ExpertGroups g,
                             float* __restrict__ y) {
  __shared__ float partial[kWarps - 1][kFrags][4][32];
  if (static_cast<int>(blockIdx.x) >= *g.num_active) return;  // uniform over the block
  const int e = g.active[blockIdx.x];
  const int begin = g.offsets[e], n_slots = g.offsets[e + 1] - begin;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, t = lane % 4;
  const int in = m.in, out = m.out;
  const int row0 = blockIdx.y * kRows;
  const int64_t row_a = static_cast<int64_t>(e) * out + row0 + gid, row_b = row_a + 8;
  const uint8_t* codes = static_cast<const uint8_t*>(m.w);
  const uint8_t* codes_a = codes + row_a * (in / 2);
  const uint8_t* codes_b = codes + row_b * (in / 2);
  const int scale_bytes = kInt4 ? in / 16 : in / 32;  // a row's: bf16 or E8M0 scales
  const uint8_t* scales_a = m.scales + row_a * scale_bytes;
  const uint8_t* scales_b = m.scales + row_b * scale_bytes;
  const int n_slices = in / kSlice;

  constexpr int kTokens = 8 * kFrags;
  for (int tile = 0; tile < n_slots; tile += kTokens) {
    const int n_tile = min(kTokens, n_slots - tile);
    const int n_frags = (n_tile + 7) / 8;
    // Token 8f + g of the tile: its x row (nullptr past the tile's end).
    const bf16* x_rows[kFrags];
    int slot_of[kFrags][2];  // the C fragment's tokens 8f + 2t, 8f + 2t + 1
#pragma unroll
    for (int f = 0; f < kFrags; ++f) {
      const int n = 8 * f + gid;
      x_rows[f] = n < n_tile ? x + static_cast<int64_t>(g.perm[begin + tile + n] / x_row_div) * in : nullptr;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int nc = 8 * f + 2 * t + j;
        slot_of[f][j] = nc < n_tile ? g.perm[begin + tile + nc] : -1;
      }
    }
    float acc[kFrags][4];
#pragma unroll
    for (int f = 0; f < kFrags; ++f) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.0f;

    SliceLoads<kFrags> next;
    if (warp < n_slices) load_slice<kInt4>(next, codes_a, codes_b, scales_a, scales_b, x_rows, n_frags, warp * kSlice, t);
    for (int sl = warp; sl < n_slices; sl += kWarps) {
      const SliceLoads<kFrags> cur = next;
      if (sl + kWarps < n_slices)
        load_slice<kInt4>(next, codes_a, codes_b, scales_a, scales_b, x_rows, n_frags, (sl + kWarps) * kSlice, t);
      // Scales past 128 (values beyond 12) take the two-multiply path, decided per slice
      // for the warp.
      if constexpr (kInt4)
        slice_mmas_int4(cur, n_frags, acc);
      else if (__any_sync(0xffffffffu, cur.scale_a > 128 || cur.scale_b > 128))
        slice_mmas<true>(cur, n_frags, acc);
      else
        slice_mmas<false>(cur, n_frags, acc);
    }
    // Warps 1..3 hand their partial tiles to warp 0, which adds them in warp order.
    if (warp > 0) {
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[warp - 1][f][i][lane] = acc[f][i];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int f = 0; f < kFrags; ++f) {
        if (f >= n_frags) break;
#pragma unroll
        for (int i = 0; i < 4; ++i)
          for (int w = 0; w < kWarps - 1; ++w) acc[f][i] += partial[w][f][i][lane];
        // C fragment: rows g / g + 8, tokens 2t / 2t + 1.
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int64_t s = slot_of[f][j];
          if (s < 0) continue;
          y[s * out + row0 + gid] = acc[f][j];
          y[s * out + row0 + gid + 8] = acc[f][2 + j];
        }
      }
    }
    __syncthreads();  // partial is free for the next tile
  }
}

}  // namespace

bool grouped_mxfp4_mma_supported(const StackedExperts& m, bool x_bf16) {
  return x_bf16 && (m.kind == StackedExperts::Kind::mxfp4 || m.kind == StackedExperts::Kind::int4_pairs) &&
         m.in % kSlice == 0 && m.out % kRows == 0;
}

void grouped_mxfp4_mma(const bf16* x, int x_row_div, const StackedExperts& m, const ExpertGroups& groups,
                       int max_active, int n_tokens, float* y, cudaStream_t stream) {
  const dim3 grid(max_active, m.out / kRows);
  // An expert gets at most n_tokens slots (a token picks an expert once).
  const int frags = n_tokens <= 8 ? 1 : (n_tokens <= 256 ? 2 : 4);
  const bool int4 = m.kind == StackedExperts::Kind::int4_pairs;
  auto* kernel = int4 ? (frags == 1 ? grouped_mxfp4_mma_kernel<true, 1>
                                    : (frags == 2 ? grouped_mxfp4_mma_kernel<true, 2> : grouped_mxfp4_mma_kernel<true, 4>))
                      : (frags == 1 ? grouped_mxfp4_mma_kernel<false, 1>
                                    : (frags == 2 ? grouped_mxfp4_mma_kernel<false, 2> : grouped_mxfp4_mma_kernel<false, 4>));
  kernel<<<grid, kWarps * 32, 0, stream>>>(x, x_row_div, m, groups, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
