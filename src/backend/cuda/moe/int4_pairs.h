#pragma once
// INT4 words (compressed-tensors pack-quantized, backend/cpu/int4.h: element i of a word at
// bits 4i .. 4i + 3 as u = q + 8) re-laid at load for the MXFP4 fast kernels' thread layout
// (mxfp4_rows.cuh), behind MOONRUN_INT4_FAST=1 (cuda_ops.cpp).
//
// Why a different layout from MXFP4's. An E2M1 code times its E8M0 scale is exact in bf16, so
// the MXFP4 kernels scale the A operand before the MMA. q * scale (q in [-8, 7], a bf16
// scale) needs up to 11 significant bits: rounded to bf16 it would not be the CPU's weight
// (cpu::dequantize_int4_g32, exact in fp32). So the INT4 kernels feed the MMA q itself (a
// small integer, exact in bf16; each x * q product exact in fp32), give every MMA step the
// 16 k of one scale group, and apply the group's scale to that step pair's fp32 sums:
// sum_k x_k * q_k * s with the CPU's weights q_k * s, only the rounding order differs. For
// that, thread t of a 64-wide slice takes k 8t .. 8t + 7 (group 0) and 32 + 8t .. 32 + 8t + 7
// (group 1), i.e. words t and 4 + t of the slice's eight, and MMA step (group G, half h)
// takes pairs 2h and 2h + 1 of word G, against x pairs of the same k.
//
// The layout, per 64-wide slice of a row (8 words; rows of in % 64 == 0 are whole slices, so
// the stacked array is a sequence of slices):
// - word order t, 4 + t for t = 0..3 (slice words 0, 4, 1, 5, 2, 6, 3, 7): thread t's two
//   words are one 8-byte load at byte 8t, as the MXFP4 kernels load their codes;
// - within a word, element 2p at bits 4p .. 4p + 3 and element 2p + 1 at bits 16 + 4p ..
//   16 + 4p + 3 (p = 0..3): the bf16 pair (2p, 2p + 1) is ((q >> 4p) & 0x000F000F) |
//   0x43004300 = 128 + u in each half (bf16 has 7 mantissa bits: 128 .. 143 exact), and one
//   bf16x2 subtract of 136 gives q, exact.
// Host and device code: the load-time re-layout kernel, the kernels, the reference kernel
// (which reads values one at a time) and the unit test use these same functions.
#include <cstdint>

#if defined(__CUDACC__)
#define MR_INT4_FN __host__ __device__ __forceinline__
#else
#define MR_INT4_FN inline
#endif

namespace moonrun::int4_pairs {

constexpr int kSliceWords = 8;            // 64 k: two scale groups of 32
constexpr uint32_t kPairMask = 0x000F000Fu;
constexpr uint32_t kPairBias = 0x43004300u;  // bf16 128 in both halves
constexpr uint32_t kPairOffset = 0x43084308u;  // bf16 136 = 128 + 8 in both halves

// Where standard word w (0..7) of a slice goes in the re-laid slice, and back.
MR_INT4_FN constexpr int relaid_position(int w) { return w < 4 ? 2 * w : 2 * (w - 4) + 1; }
MR_INT4_FN constexpr int standard_position(int pos) { return pos % 2 == 0 ? pos / 2 : 4 + pos / 2; }

// Bit offset of element i (0..7) in a re-laid word.
MR_INT4_FN constexpr int element_shift(int i) { return 4 * (i / 2) + 16 * (i % 2); }

// A standard word's eight nibbles re-laid within the word.
MR_INT4_FN constexpr uint32_t relay_word(uint32_t standard) {
  uint32_t out = 0;
  for (int i = 0; i < 8; ++i) out |= ((standard >> (4 * i)) & 0xFu) << element_shift(i);
  return out;
}

// Element i's stored nibble u = q + 8 of a re-laid word.
MR_INT4_FN constexpr uint32_t nibble_of(uint32_t relaid, int i) { return (relaid >> element_shift(i)) & 0xFu; }

// One slice (8 standard words, in k order) re-laid.
MR_INT4_FN constexpr void relay_slice(const uint32_t standard[kSliceWords], uint32_t out[kSliceWords]) {
  for (int w = 0; w < kSliceWords; ++w) out[relaid_position(w)] = relay_word(standard[w]);
}

// Element k (0..63) of a re-laid slice: its stored nibble u = q + 8.
MR_INT4_FN constexpr uint32_t slice_nibble(const uint32_t relaid[kSliceWords], int k) {
  return nibble_of(relaid[relaid_position(k / 8)], k % 8);
}

// Elements 2p (low half) and 2p + 1 (high half) of a re-laid word as the bf16 pair 128 + u
// (subtract kPairOffset, bf16x2, for q).
template <int p>
MR_INT4_FN constexpr uint32_t biased_pair(uint32_t q) {
  static_assert(p >= 0 && p < 4, "four pairs a word");
  return ((q >> (4 * p)) & kPairMask) | kPairBias;
}

}  // namespace moonrun::int4_pairs
