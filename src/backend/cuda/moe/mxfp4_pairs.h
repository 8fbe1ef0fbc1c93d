#pragma once
// MXFP4 codes re-laid at load for the bf16 tensor cores: each 32-bit word of 8 E2M1 codes
// (k 0..7 of the word, standard layout: code n in bits 4n .. 4n + 3, sign bit 3) rewritten so
// that the bf16 pair of codes (2p, 2p + 1) - k in the natural order of x's bf16 pairs, so x
// needs no byte permutes - comes out with at most one shift and one mask for p = 0, 1, 2.
//
// The target, per mxfp4_rows.cuh: a code s|e1 e0|m as the bf16 2^-126 * value(code) has the
// sign in bit 15 and e1 e0 m in bits 8 .. 6 (the high half of the pair: + 16). The 8 bits of a
// pair, {6, 7, 8, 15, 22, 23, 24, 31}, tile a 32-bit word at most three times by shifts (three
// disjoint copies at shifts 0, 3, 6; no fourth exists, checked by search over every set of
// four), so pair 3 takes the bits left over, {10, 11, 13, 14} (+ 16), and three shifts:
//   pair 0: q & M                              codes 0, 1 in place
//   pair 1: (q << 3) & M                       codes 2, 3 three bits down
//   pair 2: (q << 6) & M                       codes 4, 5 six bits down
//   pair 3: ((q >> 4) & m, e0) | ((q >> 5) & e1) | ((q << 1) & s)
//                                               codes 6, 7: m, e0 at 10, 11; e1 at 13; s at 14
// with M = 0x81C081C0. That is 11 integer operations a word against 15 for the standard
// layout, and no x permutes (2 more a word per tile). Host and device code: the loader's
// CUDA re-layout kernel, the kernels that read codes, and the unit test that checks every
// code in every position against the standard decoding use these same functions.
#include <cstdint>

#if defined(__CUDACC__)
#define MR_MXFP4_FN __host__ __device__ __forceinline__
#else
#define MR_MXFP4_FN inline
#endif

namespace moonrun::mxfp4_pairs {

constexpr uint32_t kPairMask = 0x81C081C0u;

// Code n (0..7) of a standard word.
MR_MXFP4_FN constexpr uint32_t standard_code(uint32_t word, int n) { return (word >> (4 * n)) & 0xFu; }

// Where code n's bits go in the re-laid word: sign, e1, e0, m (bit positions).
struct CodeBits {
  int s, e1, e0, m;
};
MR_MXFP4_FN constexpr CodeBits code_bits(int n) {
  const int half = 16 * (n % 2);  // even codes: the pair's low half; odd: the high half
  switch (n / 2) {
    case 0: return {15 + half, 8 + half, 7 + half, 6 + half};
    case 1: return {12 + half, 5 + half, 4 + half, 3 + half};
    case 2: return {9 + half, 2 + half, 1 + half, 0 + half};
    default: return {14 + half, 13 + half, 11 + half, 10 + half};
  }
}

// The standard word's 8 codes re-laid (a permutation of its 32 bits).
MR_MXFP4_FN constexpr uint32_t relay_word(uint32_t standard) {
  uint32_t out = 0;
  for (int n = 0; n < 8; ++n) {
    const uint32_t c = standard_code(standard, n);
    const CodeBits b = code_bits(n);
    out |= ((c >> 3) & 1u) << b.s;
    out |= ((c >> 2) & 1u) << b.e1;
    out |= ((c >> 1) & 1u) << b.e0;
    out |= (c & 1u) << b.m;
  }
  return out;
}

// Code n (0..7, standard nibble) of a re-laid word: for code that reads one code at a time.
MR_MXFP4_FN constexpr uint32_t code_of(uint32_t relaid, int n) {
  const CodeBits b = code_bits(n);
  return (((relaid >> b.s) & 1u) << 3) | (((relaid >> b.e1) & 1u) << 2) | (((relaid >> b.e0) & 1u) << 1) |
         ((relaid >> b.m) & 1u);
}

// Codes 2p (low half) and 2p + 1 (high half) of a re-laid word as the bf16 pair
// 2^-126 * value (times the E8M0 scale's 2^(s - 1), mxfp4_rows.cuh, to dequantise).
template <int p>
MR_MXFP4_FN constexpr uint32_t pair(uint32_t q) {
  static_assert(p >= 0 && p < 4, "four pairs a word");
  if constexpr (p == 0) return q & kPairMask;
  if constexpr (p == 1) return (q << 3) & kPairMask;
  if constexpr (p == 2) return (q << 6) & kPairMask;
  return ((q >> 4) & 0x00C000C0u) | ((q >> 5) & 0x01000100u) | ((q << 1) & 0x80008000u);
}

}  // namespace moonrun::mxfp4_pairs
