#pragma once
// Scalar formats: the element types of checkpoints and of backend tensors, and exact
// conversions to float32.
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace moonrun {

// The safetensors element types (the names are the format's spelling). Backend tensors use
// the same enum; MXFP4 weights are U8 codes + U8 scales (backend/tensor.h).
enum class DType : uint8_t { BF16, F16, F32, F8_E4M3, U8, I8, I32, I64 };
inline constexpr DType kAllDTypes[] = {DType::BF16, DType::F16, DType::F32, DType::F8_E4M3,
                                       DType::U8,   DType::I8,  DType::I32, DType::I64};

constexpr size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::BF16: case DType::F16: return 2;
    case DType::F32: case DType::I32: return 4;
    case DType::F8_E4M3: case DType::U8: case DType::I8: return 1;
    case DType::I64: return 8;
  }
  return 0;
}

// "BF16", "F8_E4M3", ...
constexpr const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F32: return "F32";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

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

// float32 -> float8 e4m3fn, round to nearest even, saturating to +-448 (what CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and torch's saturated cast give; the
// fp8 KV cache stores this). NaN -> 0x7f (with the sign).
inline uint8_t f32_to_f8e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7f);
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7e);  // >= 448 (and inf): the largest finite
  if (a < 0x3c800000u) {
    // Below 2^-6, the subnormal step 2^-9: round |f| * 2^9 to an integer, ties to even (an
    // exact scaling; 8 is the smallest normal, whose code is 8 as well).
    float m;
    std::memcpy(&m, &a, 4);
    m *= 512.0f;
    const float fl = static_cast<float>(static_cast<int>(m));
    const float frac = m - fl;
    int q = static_cast<int>(fl);
    if (frac > 0.5f || (frac == 0.5f && (q & 1))) ++q;
    return static_cast<uint8_t>(sign | q);
  }
  // Normal: keep 3 of the 23 mantissa bits, ties to even (a carry moves the exponent up).
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  const uint32_t exp = (r >> 23) - 127 + 7, mant = (r >> 20) & 7u;
  if (exp > 15 || (exp == 15 && mant == 7)) return static_cast<uint8_t>(sign | 0x7e);
  return static_cast<uint8_t>(sign | (exp << 3) | mant);
}

}  // namespace moonrun
