// The MXFP4 routed-expert GEMM for prefill on Hopper's warpgroup MMAs (wgmma, sm_90a): the
// same y[s, o] = sum_i x[s / x_row_div, i] * W_e[o, i] as expert_linear.cu's kernels, for
// bf16 activations and MXFP4 weights with in % 64 == 0 and out % 128 == 0 (every K3 expert
// shape), taken when a step has enough tokens that every expert sees many (prefill chunks).
//
// Layout of the work: one block of two warpgroups owns 128 output rows of one active expert
// (grid x: the expert, y: the row tile) - the M side, 64 rows a warpgroup - and the expert's
// tokens are the N side, up to 256 a pass in four n64 MMAs sharing each dequantised A
// fragment. The reduction runs over 64-wide k-steps through a 4-deep cp.async pipeline:
// every thread copies a piece of the step's codes and of the token rows (gathered through
// the expert's slot list) into shared memory, the token rows in wgmma's 128-byte swizzle
// (common/wgmma.cuh: the B operand, K-major). A comes from registers: each thread reads the
// code words of its two rows (g, g + 8 of its warp) and takes pair t of each - with the codes
// re-laid at load (mxfp4_pairs.h), pair p of a word is k 2p, 2p + 1 of its 8, which is the
// register-A layout's k 2t, 2t + 1 (word 2s) and 2t + 8, 2t + 9 (word 2s + 1) of k16 step s -
// and multiplies it by its group's E8M0 scale as a bf16 power of two (mxfp4_rows.cuh:
// exact), so the MMA accumulates the CPU's code * scale * x products in fp32. One wgmma group
// stays in flight while the next step's fragments are made.
//
// INT4 (Kind::int4_pairs, words re-laid at load: int4_pairs.h; MOONRUN_INT4_WGMMA=0 leaves it
// to expert_linear_mma.cu's exact kernel, 2.1x slower at the K2.7 slice's 8k prefill):
// the same bytes a row (eight u32 words a 64-wide step, as MXFP4's 32 code bytes), the same
// copies and MMAs; only the A fragments differ. Thread t takes elements 2t, 2t + 1 of the
// step's standard words 2s and 2s + 1 (re-laid positions 2w or 2(w - 4) + 1), q exact in
// bf16 (128 + u - 136), times the group's bf16 scale in one bf16x2 multiply: the weight
// q * scale ROUNDED to bf16 (round to nearest even), which is what vLLM's Marlin W4A16 feeds
// its bf16 MMAs and what a bf16 copy of the checkpoint would hold. It is not the CPU's exact
// fp32 q * scale (8 + 4 significant bits; expert_linear_mma.cu keeps that by scaling each
// group's fp32 partial sums, which needs the accumulators per group: at wgmma's n64 x four
// chunks that is twice the registers a thread has). The contract: weights within 2^-9
// relative; the op test Int4WgmmaPrefillExpertsMatchTheCpu measured the bf16 experts' output
// within 2.5e-3 .. 3.6e-3 of the CPU's (normalised to the largest output; the exact kernel's
// 1.2e-3 .. 1.9e-3, the bf16 check's bound 2e-2) on an H100, 2026-12-07.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/bulk_copy.cuh"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/wgmma.cuh"
#include "backend/cuda/moe/moe_ops.h"
#include "backend/cuda/moe/mxfp4_rows.cuh"

#include <cstdlib>

namespace moonrun::cuda {

namespace {

constexpr int kRows = 128;             // output rows a block (two warpgroups of 64)
constexpr int kStep = 64;              // k a pipeline step
constexpr int kChunk = 64;             // tokens an MMA (n64)
constexpr int kChunks = 4;             // n64 MMAs a pass: up to 256 tokens
constexpr int kStages = 4;
constexpr int kCodeStride = 48;        // bytes a row of a step's codes (32 used; 48 keeps rows on distinct banks)
constexpr int kThreads = 256;
constexpr uint32_t kXStageBytes = kChunks * kChunk * 128;  // [256 tokens][64 k] bf16, swizzled
constexpr uint32_t kCodeStageBytes = kRows * kCodeStride;
constexpr int kMaxScaleGroups = 256;   // in / 32: up to 8,192 inputs

// The scales live in shared memory whole: one byte (E8M0) or two (INT4's bf16) a group.
__host__ __device__ constexpr size_t smem_bytes(int in, bool int4) {
  return 1024 + kStages * (kXStageBytes + kCodeStageBytes) + static_cast<size_t>(kRows) * (in / 32) * (int4 ? 2 : 1);
}

// INT4: elements 2t, 2t + 1 of a re-laid word as the bf16 pair of their weights, q * scale
// rounded to bf16 (scale2: the group's bf16 scale in both halves).
__device__ __forceinline__ uint32_t int4_weight_pair(uint32_t w, int t, uint32_t scale2) {
  const uint32_t biased = ((w >> (4 * t)) & int4_pairs::kPairMask) | int4_pairs::kPairBias;
  return mxfp4::bf16x2_mul(int4::bf16x2_sub(biased, int4_pairs::kPairOffset), scale2);
}

// Pair t (0..3) of a re-laid code word: k 2t, 2t + 1 of its 8 (mxfp4_pairs::pair, with t at
// run time: the four lanes of a row group each take their own).
__device__ __forceinline__ uint32_t pair_of(uint32_t q, int t) {
  const uint32_t low = (q << (3 * t)) & mxfp4_pairs::kPairMask;  // t = 0, 1, 2
  return t == 3 ? mxfp4_pairs::pair<3>(q) : low;
}

// What a pass needs of the block: its shared memory, the expert's codes, this thread's rows.
struct Block {
  unsigned char* x_s;       // [kStages][kXStageBytes]
  unsigned char* codes_s;   // [kStages][kRows][kCodeStride]
  const uint8_t* sc_a;      // this thread's rows' scales in shared memory (MXFP4: E8M0)
  const uint8_t* sc_b;
  const uint16_t* sc16_a;   // (INT4: bf16)
  const uint16_t* sc16_b;
  const uint8_t* codes;     // the block's 128 code rows in memory
  const bf16* x;
  const int* perm;          // the expert's slots
  int x_row_div, in, out, n_steps, row0, ra, rb, t, tid;
  bool two_step;
};

// One pass over the expert's slots [pass, pass + n_pass), n_pass <= 256: ceil(n_pass / 64)
// n64 MMAs a k16 step (a run-time bound, uniform over the block: ptxas fences the registers
// around the branch, which costs less than four copies of the loop, whose registers made it
// serialise every MMA).
template <bool kInt4>
__device__ __forceinline__ void run_pass(const Block& b, int pass, int n_pass, float* __restrict__ y) {
  constexpr int NC = kChunks;
  const int n_chunks = (n_pass + kChunk - 1) / kChunk;
  // The pass's token rows: row tid, 8 pieces of 16 bytes a step.
  const bf16* x_row = b.tid < n_pass ? b.x + static_cast<int64_t>(b.perm[pass + b.tid] / b.x_row_div) * b.in : nullptr;
  auto load_step = [&](int k, int stage) {
    unsigned char* xs = b.x_s + stage * kXStageBytes;
    if (x_row) {
#pragma unroll
      for (int c = 0; c < 8; ++c) cp_async16(xs + sw128_offset(b.tid, 8 * c), x_row + k * kStep + 8 * c);
    }
    // Codes: 128 rows x 32 bytes, one 16-byte piece a thread.
    const int r = b.tid / 2, half = b.tid % 2;
    cp_async16(b.codes_s + stage * kCodeStageBytes + r * kCodeStride + 16 * half,
               b.codes + static_cast<int64_t>(r) * (b.in / 2) + k * (kStep / 2) + 16 * half);
  };
  for (int s = 0; s < kStages - 2; ++s) {
    if (s < b.n_steps) load_step(s, s);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  float acc[NC][32];
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[c][i] = 0.0f;
  // Two steps' A fragments: the MMA group in flight reads one while the next is made.
  uint32_t a_even[4][4], a_odd[4][4];
  auto step = [&](int k, uint32_t(&frag)[4][4]) {
    wgmma::wait<1>();  // the MMAs of step k - 2 are done: their stage and fragments are free
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 3) : "memory");
    fence_view_async_shared();  // the copies are read by the MMAs (the async proxy)
    __syncthreads();   // step k has landed for every thread; every group is past step k - 2
    if (k + kStages - 2 < b.n_steps) load_step(k + kStages - 2, (k + kStages - 2) % kStages);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    const int stage = k % kStages;
    const unsigned char* cs = b.codes_s + stage * kCodeStageBytes;
    if constexpr (kInt4) {
      const uint32_t* wa = reinterpret_cast<const uint32_t*>(cs + b.ra * kCodeStride);
      const uint32_t* wb = reinterpret_cast<const uint32_t*>(cs + b.rb * kCodeStride);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // k16 step s: standard words 2s, 2s + 1 of the step, at their re-laid positions.
        constexpr int kPos[4][2] = {{0, 2}, {4, 6}, {1, 3}, {5, 7}};
        const uint32_t sa = b.sc16_a[2 * k + s / 2], sb = b.sc16_b[2 * k + s / 2];
        const uint32_t fa = sa | (sa << 16), fb = sb | (sb << 16);
        frag[s][0] = int4_weight_pair(wa[kPos[s][0]], b.t, fa);
        frag[s][1] = int4_weight_pair(wb[kPos[s][0]], b.t, fb);
        frag[s][2] = int4_weight_pair(wa[kPos[s][1]], b.t, fa);
        frag[s][3] = int4_weight_pair(wb[kPos[s][1]], b.t, fb);
      }
    } else {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      // k16 step s: k 16s .. 16s + 15 of the step (words 2s, 2s + 1), scale group 2k + s / 2.
      const uint2 wa = *reinterpret_cast<const uint2*>(cs + b.ra * kCodeStride + 8 * s);
      const uint2 wb = *reinterpret_cast<const uint2*>(cs + b.rb * kCodeStride + 8 * s);
      const uint32_t sa = b.sc_a[2 * k + s / 2], sb = b.sc_b[2 * k + s / 2];
      if (b.two_step) {
        const uint32_t fa = mxfp4::scale_factor<true>(sa), fb = mxfp4::scale_factor<true>(sb);
        frag[s][0] = mxfp4::scaled<true>(pair_of(wa.x, b.t), fa);
        frag[s][1] = mxfp4::scaled<true>(pair_of(wb.x, b.t), fb);
        frag[s][2] = mxfp4::scaled<true>(pair_of(wa.y, b.t), fa);
        frag[s][3] = mxfp4::scaled<true>(pair_of(wb.y, b.t), fb);
      } else {
        const uint32_t fa = mxfp4::scale_factor<false>(sa), fb = mxfp4::scale_factor<false>(sb);
        frag[s][0] = mxfp4::scaled<false>(pair_of(wa.x, b.t), fa);
        frag[s][1] = mxfp4::scaled<false>(pair_of(wb.x, b.t), fb);
        frag[s][2] = mxfp4::scaled<false>(pair_of(wa.y, b.t), fa);
        frag[s][3] = mxfp4::scaled<false>(pair_of(wb.y, b.t), fb);
      }
    }
    }
    const uint32_t xb = smem_address(b.x_s + stage * kXStageBytes);
    wgmma::fence();
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (c >= n_chunks) break;
#pragma unroll
      for (int s = 0; s < 4; ++s)
        wgmma::mma_m64n64k16_rs(acc[c], frag[s], wgmma::desc_sw128(xb + c * kChunk * 128 + 32 * s), true);
    }
    wgmma::commit();
  };
  for (int k = 0; k < b.n_steps; k += 2) {
    step(k, a_even);
    if (k + 1 < b.n_steps) step(k + 1, a_odd);
  }
  wgmma::wait<0>();
#pragma unroll
  for (int c = 0; c < NC; ++c) wgmma::fence_operands(acc[c]);
  // Accumulator (chunk c): rows ra / rb, tokens 64c + 8j + 2t (+1).
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    if (c >= n_chunks) break;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = kChunk * c + 8 * j + 2 * b.t + e;
        if (n >= n_pass) continue;
        const int64_t slot = b.perm[pass + n];
        y[slot * b.out + b.row0 + b.ra] = acc[c][4 * j + e];
        y[slot * b.out + b.row0 + b.rb] = acc[c][4 * j + 2 + e];
      }
    }
  }
  __syncthreads();  // the stages are free for the next pass
}

template <bool kInt4>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_mxfp4_wgmma_kernel(const bf16* __restrict__ x, int x_row_div, StackedExperts m, ExpertGroups g,
                               float* __restrict__ y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  if (static_cast<int>(blockIdx.x) >= *g.num_active) return;  // uniform over the block
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int e = g.active[blockIdx.x];
  const int begin = g.offsets[e], n_slots = g.offsets[e + 1] - begin;
  const int groups = m.in / 32;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  Block b;
  b.x_s = smem;
  b.codes_s = smem + kStages * kXStageBytes;
  uint8_t* scales_s = b.codes_s + kStages * kCodeStageBytes;  // [kRows][in / 32]
  b.row0 = blockIdx.y * kRows;
  b.codes = static_cast<const uint8_t*>(m.w) + (static_cast<int64_t>(e) * m.out + b.row0) * (m.in / 2);
  b.x = x;
  b.perm = g.perm + begin;
  b.x_row_div = x_row_div;
  b.in = m.in;
  b.out = m.out;
  b.n_steps = m.in / kStep;
  b.ra = 64 * (warp / 4) + 16 * (warp % 4) + lane / 4;
  b.rb = b.ra + 8;
  b.t = lane % 4;
  b.tid = tid;
  if constexpr (kInt4) {
    // The block's bf16 scales, whole (the rows' scales are contiguous: [E * out, in / 32]).
    uint16_t* s16 = reinterpret_cast<uint16_t*>(scales_s);
    const uint16_t* src = reinterpret_cast<const uint16_t*>(m.scales) + (static_cast<int64_t>(e) * m.out + b.row0) * groups;
    for (int i = tid; i < kRows * groups; i += kThreads) s16[i] = src[i];
    b.sc16_a = s16 + b.ra * groups;
    b.sc16_b = s16 + b.rb * groups;
    b.sc_a = b.sc_b = nullptr;
    b.two_step = false;
    __syncthreads();
  } else {
    b.sc_a = scales_s + b.ra * groups;
    b.sc_b = scales_s + b.rb * groups;
    b.sc16_a = b.sc16_b = nullptr;
    // The block's scales, whole; a scale past 128 sends every pair through the two-multiply path.
    bool big = false;
    for (int i = tid; i < kRows * groups; i += kThreads) {
      const uint8_t s = m.scales[(static_cast<int64_t>(e) * m.out + b.row0) * groups + i];
      scales_s[i] = s;
      big |= s > 128;
    }
    b.two_step = __syncthreads_or(big);
  }
  for (int pass = 0; pass < n_slots; pass += kChunks * kChunk) {
    const int n_pass = min(kChunks * kChunk, n_slots - pass);
    run_pass<kInt4>(b, pass, n_pass, y);
  }
#else
  __trap();
#endif
}

}  // namespace

bool int4_wgmma_enabled() {
  const char* v = std::getenv("MOONRUN_INT4_WGMMA");  // read at each call: the op tests flip it
  return v == nullptr || v[0] != '0';
}

bool grouped_mxfp4_wgmma_supported(const StackedExperts& m, bool x_bf16) {
  const bool kind_ok = m.kind == StackedExperts::Kind::mxfp4 ||
                       (m.kind == StackedExperts::Kind::int4_pairs && int4_wgmma_enabled());
  return x_bf16 && kind_ok && m.in % kStep == 0 && m.out % kRows == 0 && m.in / 32 <= kMaxScaleGroups;
}

void grouped_mxfp4_wgmma(const bf16* x, int x_row_div, const StackedExperts& m, const ExpertGroups& groups,
                         int max_active, float* y, cudaStream_t stream) {
  if (max_active <= 0) return;
  const bool int4 = m.kind == StackedExperts::Kind::int4_pairs;
  const size_t smem = smem_bytes(m.in, int4);
  const dim3 grid(max_active, m.out / kRows);
  if (int4) {
    allow_dynamic_smem(grouped_mxfp4_wgmma_kernel<true>, smem);
    grouped_mxfp4_wgmma_kernel<true><<<grid, kThreads, smem, stream>>>(x, x_row_div, m, groups, y);
  } else {
    allow_dynamic_smem(grouped_mxfp4_wgmma_kernel<false>, smem);
    grouped_mxfp4_wgmma_kernel<false><<<grid, kThreads, smem, stream>>>(x, x_row_div, m, groups, y);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
