#include "model/synthetic_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/dtype.h"

namespace moonrun {

namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// How a float tensor's elements are drawn: uniform in [lo, hi), or log U(1, 16) (A_log).
struct Law {
  double lo = -1, hi = 1;
  bool log_uniform = false;
};

Law law_of(const TensorSpec& t, RouterBias router_bias) {
  const std::string& n = t.name;
  if (ends_with(n, "norm.weight") || ends_with(n, "layernorm.weight") || ends_with(n, ".norm0.weight") ||
      ends_with(n, ".norm1.weight"))
    return {0.9, 1.1};
  if (ends_with(n, "_res_proj.weight")) return {-0.5, 0.5};
  if (ends_with(n, ".A_log")) return {0, 0, true};
  if (ends_with(n, ".dt_bias") || ends_with(n, "conv1d.weight")) return {-0.5, 0.5};
  // Wide correction biases keep routing decisions away from ties (K3_SPEC.md §6).
  if (ends_with(n, "e_score_correction_bias"))
    return router_bias == RouterBias::balanced ? Law{-0.01, 0.01} : Law{-0.5, 0.5};
  if (ends_with(n, "embed_tokens.weight")) return {-1, 1};
  // A [out, in] projection: uniform with variance 1/in. A kernel [out, c, kh, kw] (the
  // vision tower's patch embedding) reads c * kh * kw inputs per output.
  double fan_in = static_cast<double>(t.shape.back());
  if (t.shape.size() == 4) fan_in = static_cast<double>(t.shape[1] * t.shape[2] * t.shape[3]);
  const double b = std::sqrt(3.0 / fan_in);
  return {-b, b};
}

}  // namespace

void synthetic_bytes(const TensorSpec& t, uint64_t seed, int64_t first, int64_t count, uint8_t* out,
                     RouterBias router_bias) {
  const uint64_t key = splitmix64(seed ^ fnv1a(t.name));
  if (t.dtype == DType::U8) {
    if (ends_with(t.name, "weight_scale") || ends_with(t.name, "weight_scales")) {
      // E8M0 scales: random E2M1 codes have RMS ~2.93; aim the weights at RMS 1/sqrt(in).
      const double in = static_cast<double>(t.shape.back()) * 32;
      const int base = 127 + static_cast<int>(std::lround(-std::log2(2.93 * std::sqrt(in))));
      for (int64_t i = 0; i < count; ++i)
        out[i] = static_cast<uint8_t>(base + static_cast<int>(splitmix64(key + first + i) % 3) - 1);
    } else {
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<uint8_t>(splitmix64(key + first + i) >> 56);
    }
    return;
  }
  if (t.dtype == DType::I32 || t.dtype == DType::I64) {
    // INT4 words (eight u4 codes each, every bit pattern valid): random bits. (An int64
    // weight_shape must equal its layout: make_slice writes those, not this.)
    const size_t elem = dtype_size_bytes(t.dtype);
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t r = splitmix64(key + first + i);  // per element: the same bytes whatever the chunking
      std::memcpy(out + elem * i, &r, elem);            // little-endian: the low bytes
    }
    return;
  }
  Law law = law_of(t, router_bias);
  if (t.dtype == DType::BF16 && ends_with(t.name, "weight_scale")) {
    // INT4 group scales (bf16, one per 32 inputs): random codes q - 8 in [-8, 7] have RMS
    // ~4.6; aim the weights at RMS 1/sqrt(in), within 20 %.
    const double s = 1.0 / (4.6 * std::sqrt(static_cast<double>(t.shape.back()) * 32));
    law = {0.8 * s, 1.2 * s};
  }
  for (int64_t i = 0; i < count; ++i) {
    const double u = static_cast<double>(splitmix64(key + first + i) >> 40) * 0x1.0p-24;  // [0, 1)
    const float v = static_cast<float>(law.log_uniform ? std::log(1.0 + 15.0 * u) : law.lo + (law.hi - law.lo) * u);
    if (t.dtype == DType::F32) {
      std::memcpy(out + 4 * i, &v, 4);
    } else {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(out + 2 * i, &h, 2);
    }
  }
}

}  // namespace moonrun
