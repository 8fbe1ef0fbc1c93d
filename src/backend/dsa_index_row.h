#pragma once
// The DSA indexer-key cache row in FP8 (issue 38): DeepSeek-V3.2's indexer cache, which the
// K3.1 recipes keep too. A key of head_dim values (LayerNorm'ed, k_norm) is stored as
// head_dim float8 e4m3 codes of key / scale, then the fp32 scale in the row's last 4 bytes:
// 132 bytes for K3.1's 128 (against 512 as F32). The scale is DeepSeek's act_quant with its
// "ue8m0" format: amax / 448 (amax at least 1e-4) rounded up to a power of two, so that
// code * scale is exact and the largest value still fits e4m3's 448. Queries are NOT
// quantised here (the reference quantises q per head the same way and folds the scale into
// the weights): scores read the fp32 query against the dequantised key.
//
// A pool of such rows is F8_E4M3 with row_width head_dim + 4 (KvLayer::row_width in bytes).
// Shared by the CPU reference (cpu_ops.cpp) and the CUDA kernels (cuda/mla/dsa_ops.cu).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"

namespace moonrun {

constexpr int kDsaIndexScaleBytes = 4;
inline constexpr int dsa_fp8_row_width(int head_dim) { return head_dim + kDsaIndexScaleBytes; }

// amax -> the row's scale (a power of two, host or device).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline float dsa_index_scale(float amax) {
  const float s = fmaxf(amax, 1e-4f) / 448.0f;
  return exp2f(ceilf(log2f(s)));
}

// CPU: quantise one key row into dst (dsa_fp8_row_width(n) bytes).
inline void dsa_quantize_index_row(const float* key, int n, uint8_t* dst) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(key[i]));
  const float scale = dsa_index_scale(amax), inv = 1.0f / scale;  // exact: a power of two
  for (int i = 0; i < n; ++i) dst[i] = f32_to_f8e4m3(key[i] * inv);
  std::memcpy(dst + n, &scale, sizeof(float));
}

// CPU: a stored row back to n floats.
inline void dsa_dequantize_index_row(const uint8_t* row, int n, float* out) {
  float scale;
  std::memcpy(&scale, row + n, sizeof(float));
  for (int i = 0; i < n; ++i) out[i] = f8e4m3_to_f32(row[i]) * scale;
}

}  // namespace moonrun
