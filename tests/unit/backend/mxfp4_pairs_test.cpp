// The pair-ready MXFP4 word layout (backend/cuda/moe/mxfp4_pairs.h), on the host: every code
// value in every position of a word comes back from the re-laid word as the CPU's E2M1 value
// (cpu::fp4_e2m1_value) times 2^-126, as a bf16 half of the right pair, and as the same
// standard nibble; the re-layout is a bijection of the word's bits. The CUDA kernels call
// these same functions.
#include "backend/cuda/moe/mxfp4_pairs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/mxfp4.h"

namespace moonrun {
namespace {

// A bf16 bit pattern as a float.
float bf16_value(uint32_t bits16) {
  const uint32_t f = bits16 << 16;
  float v;
  std::memcpy(&v, &f, sizeof v);
  return v;
}

uint32_t pair_of(uint32_t relaid, int p) {
  switch (p) {
    case 0: return mxfp4_pairs::pair<0>(relaid);
    case 1: return mxfp4_pairs::pair<1>(relaid);
    case 2: return mxfp4_pairs::pair<2>(relaid);
    default: return mxfp4_pairs::pair<3>(relaid);
  }
}

TEST(Mxfp4Pairs, EveryCodeInEveryPositionDecodesToItsValue) {
  std::mt19937 rng(7);
  for (int n = 0; n < 8; ++n) {
    for (uint32_t code = 0; code < 16; ++code) {
      for (int trial = 0; trial < 64; ++trial) {  // the other seven codes random
        uint32_t word = rng();
        word = (word & ~(0xFu << (4 * n))) | (code << (4 * n));
        const uint32_t relaid = mxfp4_pairs::relay_word(word);
        const uint32_t pair = pair_of(relaid, n / 2);
        const uint32_t half = n % 2 == 0 ? pair & 0xFFFFu : pair >> 16;
        const float want = cpu::fp4_e2m1_value(static_cast<uint8_t>(code)) * std::ldexp(1.0f, -126);
        const float got = bf16_value(half);
        ASSERT_EQ(got, want) << "code " << code << " at position " << n;
        ASSERT_EQ(std::signbit(got), (code & 8u) != 0) << "code " << code << " at position " << n;
        ASSERT_EQ(mxfp4_pairs::code_of(relaid, n), code) << "position " << n;
      }
    }
  }
}

TEST(Mxfp4Pairs, RelayIsABijectionOfTheWordsBits) {
  // Each of the 32 input bits lands on its own output bit.
  uint32_t seen = 0;
  for (int bit = 0; bit < 32; ++bit) {
    const uint32_t out = mxfp4_pairs::relay_word(1u << bit);
    ASSERT_EQ(__builtin_popcount(out), 1) << "bit " << bit;
    ASSERT_EQ(seen & out, 0u) << "bit " << bit;
    seen |= out;
  }
  EXPECT_EQ(seen, 0xFFFFFFFFu);
  // And the four pairs' masks cover the word once: nothing of one pair leaks into another.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 1000; ++trial) {
    const uint32_t word = rng();
    const uint32_t relaid = mxfp4_pairs::relay_word(word);
    for (int p = 0; p < 4; ++p) {
      const uint32_t pr = pair_of(relaid, p);
      EXPECT_EQ(pr & ~mxfp4_pairs::kPairMask, 0u);
      const uint32_t lo = mxfp4_pairs::standard_code(word, 2 * p), hi = mxfp4_pairs::standard_code(word, 2 * p + 1);
      const uint32_t want = ((lo >> 3) << 15) | ((lo & 7u) << 6) | ((hi >> 3) << 31) | ((hi & 7u) << 22);
      EXPECT_EQ(pr, want) << "pair " << p;
    }
  }
}

}  // namespace
}  // namespace moonrun
