#include "backend/cpu/mxfp4.h"

#include <cmath>
#include <cstring>

namespace moonrun::cpu {

namespace {
// E2M1 magnitudes: exponent bits 2..1, mantissa bit 0 (subnormal 0.5 at exponent 0).
constexpr float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
}  // namespace

float fp4_e2m1_value(uint8_t nibble) {
  float mag = kE2M1[nibble & 0x7];
  return (nibble & 0x8) ? -mag : mag;
}

float e8m0_scale(uint8_t s) {
  if (s == 0xff) return NAN;
  // 2^(s-127) as a float32 bit pattern; s = 0 (2^-127) is a float32 subnormal.
  if (s == 0) return std::ldexp(1.0f, -127);
  uint32_t bits = static_cast<uint32_t>(s) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void dequantize_mxfp4(const uint8_t* codes, const uint8_t* scales, int rows, int cols, float* out) {
  const int bytes_per_row = cols / 2, groups_per_row = cols / 32;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* c = codes + static_cast<int64_t>(r) * bytes_per_row;
    const uint8_t* s = scales + static_cast<int64_t>(r) * groups_per_row;
    float* o = out + static_cast<int64_t>(r) * cols;
    for (int g = 0; g < groups_per_row; ++g) {
      const float scale = e8m0_scale(s[g]);
      for (int b = 0; b < 16; ++b) {
        const uint8_t byte = c[g * 16 + b];
        o[g * 32 + 2 * b] = fp4_e2m1_value(byte & 0xf) * scale;
        o[g * 32 + 2 * b + 1] = fp4_e2m1_value(byte >> 4) * scale;
      }
    }
  }
}

}  // namespace moonrun::cpu
