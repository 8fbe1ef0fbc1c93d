// The re-laid INT4 word layout (backend/cuda/moe/int4_pairs.h), on the host: every element of
// a random 64-wide slice comes back from the re-laid slice as the CPU's value
// (cpu::int4_value), through the one-at-a-time reader the reference kernel uses and through
// the bf16 pairs the fast kernels feed the MMA, at the k the kernels' thread layout assigns
// (thread t: words t and 4 + t, k 8t .. 8t + 7 and 32 + 8t .. 32 + 8t + 7). The CUDA kernels
// call these same functions.
#include "backend/cuda/moe/int4_pairs.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cpu/int4.h"

namespace moonrun {
namespace {

float bf16_value(uint32_t bits16) {
  const uint32_t f = bits16 << 16;
  float v;
  std::memcpy(&v, &f, sizeof v);
  return v;
}

uint32_t biased_pair(uint32_t relaid, int p) {
  switch (p) {
    case 0: return int4_pairs::biased_pair<0>(relaid);
    case 1: return int4_pairs::biased_pair<1>(relaid);
    case 2: return int4_pairs::biased_pair<2>(relaid);
    default: return int4_pairs::biased_pair<3>(relaid);
  }
}

TEST(Int4Pairs, PositionsAreInverse) {
  bool seen[8] = {};
  for (int w = 0; w < 8; ++w) {
    const int pos = int4_pairs::relaid_position(w);
    ASSERT_GE(pos, 0);
    ASSERT_LT(pos, 8);
    EXPECT_FALSE(seen[pos]) << "word " << w;
    seen[pos] = true;
    EXPECT_EQ(int4_pairs::standard_position(pos), w);
  }
  // Thread t's 8-byte load at byte 8t: words t (group 0) and 4 + t (group 1).
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(int4_pairs::standard_position(2 * t), t);
    EXPECT_EQ(int4_pairs::standard_position(2 * t + 1), 4 + t);
  }
}

TEST(Int4Pairs, EveryElementDecodesToTheCpuValue) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    uint32_t standard[8], relaid[8];
    for (uint32_t& w : standard) w = rng();
    if (trial < 16)  // every nibble value in every position
      for (uint32_t& w : standard) w = 0x11111111u * static_cast<uint32_t>(trial);
    int4_pairs::relay_slice(standard, relaid);
    for (int k = 0; k < 64; ++k) {
      const int want = cpu::int4_value(standard[k / 8], k % 8);
      // The reference kernel's reader.
      EXPECT_EQ(static_cast<int>(int4_pairs::slice_nibble(relaid, k)) - 8, want) << "k " << k;
    }
    // The fast kernels' view: thread t, group G (word 2t + G of the re-laid slice), pair p:
    // k 32G + 8t + 2p (low half) and + 1 (high half), as bf16 128 + u; minus 136 is q.
    for (int t = 0; t < 4; ++t)
      for (int G = 0; G < 2; ++G)
        for (int p = 0; p < 4; ++p) {
          const uint32_t pair = biased_pair(relaid[2 * t + G], p);
          for (int half = 0; half < 2; ++half) {
            const int k = 32 * G + 8 * t + 2 * p + half;
            const float v = bf16_value((pair >> (16 * half)) & 0xFFFFu) - 136.0f;
            EXPECT_EQ(v, static_cast<float>(cpu::int4_value(standard[k / 8], k % 8))) << "k " << k;
          }
        }
  }
}

TEST(Int4Pairs, OffsetConstantsAreTheBf16Values) {
  EXPECT_EQ(bf16_value(int4_pairs::kPairBias & 0xFFFFu), 128.0f);
  EXPECT_EQ(bf16_value(int4_pairs::kPairBias >> 16), 128.0f);
  EXPECT_EQ(bf16_value(int4_pairs::kPairOffset & 0xFFFFu), 136.0f);
  EXPECT_EQ(bf16_value(int4_pairs::kPairOffset >> 16), 136.0f);
  // 128 + u for every nibble: bf16's 7 mantissa bits hold it exactly.
  for (uint32_t u = 0; u < 16; ++u) EXPECT_EQ(bf16_value(0x4300u | u), 128.0f + static_cast<float>(u));
}

}  // namespace
}  // namespace moonrun
