#pragma once
// Scalar formats found in checkpoints, and exact conversions to float32.
#include <cstdint>
#include <cstring>

namespace moonrun {

// bfloat16 -> float32 is exact (the top 16 bits of a float32).
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float32 -> bfloat16, round to nearest even (what torch's .to(bfloat16) does). NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// Round a float32 through bfloat16 and back (to mimic bf16 storage between ops).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// IEEE half -> float32 (exact).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float8 e4m3fn (no infinities; 0x7f/0xff are NaN) -> float32 (exact).
inline float f8e4m3_to_f32(uint8_t v) {
  uint32_t sign = (v & 0x80u) << 24;
  uint32_t exp = (v >> 3) & 0xf;
  uint32_t mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) {
    uint32_t u = sign | 0x7fc00000u;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  float r;
  if (exp == 0) {
    r = static_cast<float>(mant) / 8.0f / 64.0f;  // 2^-6 * mant/8
  } else {
    uint32_t u = ((exp + 127 - 7) << 23) | (mant << 20);
    std::memcpy(&r, &u, 4);
  }
  return sign ? -r : r;
}

}  // namespace moonrun
