#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace moonrun {
namespace {

// Bit patterns from the IEEE/bfloat16 definitions (torch.tensor(x).to(bfloat16).view(int16)).
TEST(Dtype, Bf16KnownValues) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(0.1f), 0x3dcd);  // 0.1 rounds up in bf16
  EXPECT_FLOAT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_FLOAT_EQ(bf16_to_f32(0x4049), 3.140625f);
}

TEST(Dtype, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1+2^-7): ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 lies between 1+2^-7 (odd) and 1+2^-6 (even): goes up to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
}

TEST(Dtype, F16KnownValues) {
  EXPECT_FLOAT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_FLOAT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_FLOAT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_FLOAT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
}

TEST(Dtype, F8E4M3KnownValues) {
  EXPECT_FLOAT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_FLOAT_EQ(f8e4m3_to_f32(0x7e), 448.0f);  // largest finite e4m3fn
  EXPECT_FLOAT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_FLOAT_EQ(f8e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
}

// The encoder against the format's own definition: every finite code decodes and encodes
// back to itself, and a value between two neighbouring codes goes to the nearer one, a tie
// to the one with an even mantissa (round to nearest even, as the GPU's cvt.rn.satfinite and
// torch do). Past the largest finite value (448) it saturates.
TEST(Dtype, F8E4M3EncodesToTheNearestCodeTiesToEven) {
  for (int c = 0; c < 0x7f; ++c) {
    for (uint8_t sign : {0x00, 0x80}) {
      const uint8_t code = static_cast<uint8_t>(c | sign);
      EXPECT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(code)), code) << "code " << c;
    }
  }
  for (int c = 0; c + 1 < 0x7f; ++c) {  // neighbours c, c + 1 (positive, increasing)
    const float lo = f8e4m3_to_f32(static_cast<uint8_t>(c)), hi = f8e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact: both have few mantissa bits
    const int even = (c & 1) == 0 ? c : c + 1;
    EXPECT_EQ(f32_to_f8e4m3(mid), even) << "tie between " << lo << " and " << hi;
    EXPECT_EQ(f32_to_f8e4m3(-mid), 0x80 | even);
    EXPECT_EQ(f32_to_f8e4m3(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(f32_to_f8e4m3(std::nextafter(mid, 1e9f)), c + 1);
  }
  EXPECT_EQ(f32_to_f8e4m3(449.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -11)), 0x00);  // under half the smallest subnormal
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f32_to_f8e4m3(NAN))));
}

}  // namespace
}  // namespace moonrun
