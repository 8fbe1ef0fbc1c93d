#pragma once
// bf16 storage for activations and weights (K3_SPEC.md §2: bf16 storage, fp32 math where
// noted). cuda_bf16.h's conversions are host-callable too, so tests and loaders use the
// same round-to-nearest-even the kernels use.
#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

namespace moonrun::cuda {

using bf16 = __nv_bfloat16;

inline std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16_rn(x[i]);
  return y;
}
inline std::vector<float> to_float(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __bfloat162float(x[i]);
  return y;
}
// x rounded to bf16 and back: what a bf16 activation or weight holds.
inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

#if defined(__CUDACC__)
// The two bf16 of a 32-bit word (the lower index in the low half, as a 16-byte load of a bf16
// row holds them) as floats, exactly: one shift or mask each, no conversion instruction.
__device__ __forceinline__ float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xFFFF0000u); }
#endif

}  // namespace moonrun::cuda
