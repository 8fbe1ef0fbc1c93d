#pragma once
// MXFP4 codes onto the bf16 tensor cores (Hopper has no FP4 MMA): the dequantisation in
// registers and one k-slice of mma.m16n8k16, for moe/expert_linear_stream.cu and
// moe/expert_linear_mma.cu; and the same for re-laid INT4 words (int4_pairs.h, namespace
// int4 at the end), which the same kernels read with the same loads.
//
// Dequantisation without a table. The codes are re-laid at load (mxfp4_pairs.h) so that each
// bf16 pair of codes (k 2i, 2i + 1: x's own pairs, no byte permutes on the x side) comes out
// of a 32-bit word with one mask, one shift and a mask, or (the fourth pair) three shifts:
// each half the bf16 2^-126 * value(code), exactly, subnormals (e = 0: 0 and 0.5) included.
// One multiply by 2^(s - 1) = 2^126 * 2^(s - 127) then applies the E8M0 scale: exact, since
// code * 2^(s - 127) has two significant bits and lies in bf16's range. 2^(s - 1) is a bf16
// for s <= 128; a slice that holds a larger scale (values beyond 12, not seen in real
// checkpoints) multiplies twice, by 2^126 and by 2^(s - 127), still exact (s = 255 is NaN,
// as cpu::e8m0_scale).
//
// The k order. Thread t's 16 codes of a row in a 64-wide slice are two words (k 16t .. 16t +
// 7 and 16t + 8 .. 16t + 15); pair p of word c is k 16t + 8c + 2p, + 1, the same k as x word
// 4c + p of the thread's eight. MMA step (word c, half h) takes pairs 2h (as MMA k 2t, 2t +
// 1) and 2h + 1 (2t + 8, 2t + 9) of both rows, against x words 4c + 2h and 4c + 2h + 1.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/moe/int4_pairs.h"
#include "backend/cuda/moe/mxfp4_pairs.h"

namespace moonrun::cuda::mxfp4 {

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// bf16 pairs of the scale factors: 2^(s - 1) (one multiply, s <= 128), and 2^(s - 127), the
// E8M0 scale itself - its exponent field; s = 0 is the bf16 subnormal 2^-127, 255 NaN, as
// cpu::e8m0_scale - for the second multiply of the two-step path.
__device__ __forceinline__ uint32_t splat(uint32_t b) { return b | (b << 16); }
__device__ __forceinline__ uint32_t scale_one_step(uint32_t s) { return splat((s + 126u) << 7); }
__device__ __forceinline__ uint32_t scale_e8m0(uint32_t s) { return splat(s == 0 ? 0x0040u : (s == 255 ? 0x7FC0u : (s << 7))); }
constexpr uint32_t kTwoTo126 = 0x7E807E80u;

// A pair times its scale factor f (scale_one_step, or scale_e8m0 with kTwoStep).
template <bool kTwoStep>
__device__ __forceinline__ uint32_t scaled(uint32_t pair, uint32_t f) {
  return kTwoStep ? bf16x2_mul(bf16x2_mul(pair, kTwoTo126), f) : bf16x2_mul(pair, f);
}
template <bool kTwoStep>
__device__ __forceinline__ uint32_t scale_factor(uint32_t s) {
  return kTwoStep ? scale_e8m0(s) : scale_one_step(s);
}

// Half h of word c's MMA step for rows a and b: A operands {a0, a1, a2, a3} of
// mma_m16n8k16_bf16 (rows a / b, pairs 2h / 2h + 1), already scaled.
template <bool kTwoStep, int h>
__device__ __forceinline__ void a_operands(uint32_t qa, uint32_t qb, uint32_t fa, uint32_t fb, uint32_t a[4]) {
  a[0] = scaled<kTwoStep>(mxfp4_pairs::pair<2 * h>(qa), fa);
  a[1] = scaled<kTwoStep>(mxfp4_pairs::pair<2 * h>(qb), fb);
  a[2] = scaled<kTwoStep>(mxfp4_pairs::pair<2 * h + 1>(qa), fa);
  a[3] = scaled<kTwoStep>(mxfp4_pairs::pair<2 * h + 1>(qb), fb);
}

// One 64-wide k-slice of the m16n8k16 MMA for thread (g, t) of an m16 tile: its 16 codes of
// rows g and g + 8 (8 re-laid bytes each, k 16t .. 16t + 15 of the slice), their E8M0
// scales, and x[16t .. 16t + 15] of its token as eight bf16 pairs. kTwoStep: the scale
// multiply in two steps, needed when a scale is > 128 (correct for every scale, one multiply
// a pair slower).
template <bool kTwoStep>
__device__ __forceinline__ void mma_mxfp4_codes(uint2 ca, uint2 cb, uint32_t sa, uint32_t sb, const uint32_t xw[8],
                                                float acc[4]) {
  const uint32_t fa = scale_factor<kTwoStep>(sa), fb = scale_factor<kTwoStep>(sb);
  const uint32_t qa[2] = {ca.x, ca.y}, qb[2] = {cb.x, cb.y};
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    uint32_t a[4];
    a_operands<kTwoStep, 0>(qa[c], qb[c], fa, fb, a);
    mma_m16n8k16_bf16(acc, a[0], a[1], a[2], a[3], xw[4 * c], xw[4 * c + 1]);
    a_operands<kTwoStep, 1>(qa[c], qb[c], fa, fb, a);
    mma_m16n8k16_bf16(acc, a[0], a[1], a[2], a[3], xw[4 * c + 2], xw[4 * c + 3]);
  }
}

}  // namespace moonrun::cuda::mxfp4

namespace moonrun::cuda::int4 {

__device__ __forceinline__ uint32_t bf16x2_sub(uint32_t a, uint32_t b) {
  __nv_bfloat162 r =
      __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Pair p of a re-laid word as the bf16 pair (q_2p, q_2p+1): exact small integers.
template <int p>
__device__ __forceinline__ uint32_t q_pair(uint32_t w) {
  return bf16x2_sub(int4_pairs::biased_pair<p>(w), int4_pairs::kPairOffset);
}

// The two bf16 scales of a 32-bit word (group 2j low, 2j + 1 high) as fp32: exact.
__device__ __forceinline__ float scale_lo(uint32_t s2) { return __uint_as_float(s2 << 16); }
__device__ __forceinline__ float scale_hi(uint32_t s2) { return __uint_as_float(s2 & 0xFFFF0000u); }

// Half h of group G's MMA steps for rows a and b: A operands {a0, a1, a2, a3} of
// mma_m16n8k16_bf16 (rows a / b, pairs 2h / 2h + 1 of the group's word), unscaled q.
template <int h>
__device__ __forceinline__ void a_operands(uint32_t qa, uint32_t qb, uint32_t a[4]) {
  a[0] = q_pair<2 * h>(qa);
  a[1] = q_pair<2 * h>(qb);
  a[2] = q_pair<2 * h + 1>(qa);
  a[3] = q_pair<2 * h + 1>(qb);
}

// acc (a C fragment: rows a, a, b, b) += sums of group G times the rows' scales, in fp32.
__device__ __forceinline__ void add_scaled(const float part[4], float sa, float sb, float acc[4]) {
  acc[0] = fmaf(part[0], sa, acc[0]);
  acc[1] = fmaf(part[1], sa, acc[1]);
  acc[2] = fmaf(part[2], sb, acc[2]);
  acc[3] = fmaf(part[3], sb, acc[3]);
}

// One 64-wide k-slice for thread (g, t) of an m16 tile, the INT4 twin of
// mxfp4::mma_mxfp4_codes: its two re-laid words of rows g and g + 8 (.x: k 8t .. 8t + 7, group
// 0; .y: k 32 + 8t .. 32 + 8t + 7, group 1), the rows' two bf16 scales of the slice as one
// 32-bit word each (group 0 low), and x at the same k as eight bf16 pairs (x[8t .. 8t + 7],
// then x[32 + 8t .. 32 + 8t + 7]). Each group's two MMA steps sum q * x into zeroed
// fragments, which are then scaled in fp32 and added: the CPU's weights q * scale exactly,
// never rounded to bf16.
__device__ __forceinline__ void mma_int4_words(uint2 ca, uint2 cb, uint32_t sa2, uint32_t sb2, const uint32_t xw[8],
                                               float acc[4]) {
  const uint32_t qa[2] = {ca.x, ca.y}, qb[2] = {cb.x, cb.y};
  const float sa[2] = {scale_lo(sa2), scale_hi(sa2)}, sb[2] = {scale_lo(sb2), scale_hi(sb2)};
#pragma unroll
  for (int G = 0; G < 2; ++G) {
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t a[4];
    a_operands<0>(qa[G], qb[G], a);
    mma_m16n8k16_bf16(part, a[0], a[1], a[2], a[3], xw[4 * G], xw[4 * G + 1]);
    a_operands<1>(qa[G], qb[G], a);
    mma_m16n8k16_bf16(part, a[0], a[1], a[2], a[3], xw[4 * G + 2], xw[4 * G + 3]);
    add_scaled(part, sa[G], sb[G], acc);
  }
}

}  // namespace moonrun::cuda::int4
