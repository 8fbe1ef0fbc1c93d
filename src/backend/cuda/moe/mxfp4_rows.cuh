#pragma once
// MXFP4 codes onto the bf16 tensor cores (Hopper has no FP4 MMA): the dequantisation in
// registers and one k-slice of mma.m16n8k16, for moe/expert_linear_stream.cu (the scale and
// multiply helpers serve expert_linear_mma.cu too).
//
// Dequantisation without a table. An E2M1 code s|e1 e0|m read as the top nibble of a bf16
// half (sign at bit 15) and moved down 6 bits puts e1 e0 in the two lowest exponent bits and
// m in the top mantissa bit: the bf16 2^-126 * value(code), exactly, subnormals (e = 0: 0
// and 0.5) included. So one shift and two masks turn a 32-bit word of 8 codes into a bf16
// pair per shift of 4, and one multiply by 2^(s - 1) = 2^126 * 2^(s - 127) applies the
// E8M0 scale: exact, since code * 2^(s - 127) has two significant bits and lies in bf16's
// range. 2^(s - 1) is a bf16 for s <= 128; a tile that holds a larger scale (values beyond
// 12, not seen in real checkpoints) multiplies twice, by 2^126 and by 2^(s - 127), still
// exact (s = 255 is NaN, as cpu::e8m0_scale). The table lookups this replaces cost one
// shared-memory access per code, as much as the whole stream at the copy rate.
//
// The k order. Word q's shift by 4j pairs code 3 - j (low half) with code 7 - j (high half);
// the x side pairs the same two k with one byte permute. Thread t's 16 codes of a row are
// two words: MMA step (word c, half h) takes pairs j = 2h (MMA k 2t, 2t + 1) and 2h + 1
// (2t + 8, 2t + 9) - each code once, against its own x.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/mma.cuh"

namespace moonrun::cuda::mxfp4 {

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Codes 3 - j and 7 - j of the word as 2^-126 * value, a bf16 pair: the signs are bits 15 -
// 4j and 31 - 4j, moved up by 4j; the magnitudes bits 12 - 4j .. 14 - 4j (and + 16), moved to
// 6 .. 8 (and 22 .. 24). Written as two shifts of q, not a shift of a shift: three or four
// integer instructions a pair, the kernel's bottleneck with the MMAs idle.
template <int j>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t q) {
  constexpr int kMagShift = 4 * j - 6;  // left when positive
  const uint32_t mags = kMagShift >= 0 ? q << (kMagShift & 31) : q >> ((-kMagShift) & 31);
  return ((q << (4 * j)) & 0x80008000u) | (mags & 0x01C001C0u);
}

// bf16 pairs of the scale factors: 2^(s - 1) (one multiply, s <= 128), and 2^(s - 127), the
// E8M0 scale itself - its exponent field; s = 0 is the bf16 subnormal 2^-127, 255 NaN, as
// cpu::e8m0_scale - for the second multiply of the two-step path (and expert_linear_mma.cu).
__device__ __forceinline__ uint32_t splat(uint32_t b) { return b | (b << 16); }
__device__ __forceinline__ uint32_t scale_one_step(uint32_t s) { return splat((s + 126u) << 7); }
__device__ __forceinline__ uint32_t scale_e8m0(uint32_t s) { return splat(s == 0 ? 0x0040u : (s == 255 ? 0x7FC0u : (s << 7))); }
constexpr uint32_t kTwoTo126 = 0x7E807E80u;

// x[k1], x[k2] as a bf16 pair from the thread's 8 words of x (word i: k 2i, 2i + 1), for
// the k that code pair j of word c stands for: k1 = 8c + 3 - j, k2 = k1 + 4.
__device__ __forceinline__ uint32_t x_pair(const uint32_t xw[8], int c, int j) {
  const int k1 = 3 - j;
  return __byte_perm(xw[4 * c + k1 / 2], xw[4 * c + 2 + k1 / 2], (k1 & 1) ? 0x7632 : 0x5410);
}

// The x side of a slice for thread (g, t): x[16t .. 16t + 15] of token g (eight bf16 pairs,
// word i: k 2i, 2i + 1) regrouped as the code pairs run: xp[4c + j] = pair j of code word c.
__device__ __forceinline__ void x_pairs(const uint32_t xw[8], uint32_t xp[8]) {
#pragma unroll
  for (int c = 0; c < 2; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) xp[4 * c + j] = x_pair(xw, c, j);
}

// One 64-wide k-slice of the m16n8k16 MMA for thread (g, t) of an m16 tile: its 16 codes of
// rows g and g + 8 (8 bytes each, k 16t .. 16t + 15 of the slice), their E8M0 scales, and the
// slice's x pairs (x_pairs). kTwoStep: the scale multiply in two steps, needed when a scale
// is > 128 (correct for every scale, one multiply a pair slower).
template <bool kTwoStep>
__device__ __forceinline__ void mma_mxfp4_codes(uint2 ca, uint2 cb, uint32_t sa, uint32_t sb, const uint32_t xp[8],
                                                float acc[4]) {
  const uint32_t fa = kTwoStep ? scale_e8m0(sa) : scale_one_step(sa);
  const uint32_t fb = kTwoStep ? scale_e8m0(sb) : scale_one_step(sb);
  auto scaled = [&](uint32_t p, uint32_t f) {
    return kTwoStep ? bf16x2_mul(bf16x2_mul(p, kTwoTo126), f) : bf16x2_mul(p, f);
  };
  const uint32_t qa[2] = {ca.x, ca.y}, qb[2] = {cb.x, cb.y};
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    mma_m16n8k16_bf16(acc, scaled(e2m1_pair<0>(qa[c]), fa), scaled(e2m1_pair<0>(qb[c]), fb),
                      scaled(e2m1_pair<1>(qa[c]), fa), scaled(e2m1_pair<1>(qb[c]), fb), xp[4 * c], xp[4 * c + 1]);
    mma_m16n8k16_bf16(acc, scaled(e2m1_pair<2>(qa[c]), fa), scaled(e2m1_pair<2>(qb[c]), fb),
                      scaled(e2m1_pair<3>(qa[c]), fa), scaled(e2m1_pair<3>(qb[c]), fb), xp[4 * c + 2],
                      xp[4 * c + 3]);
  }
}

}  // namespace moonrun::cuda::mxfp4
