#pragma once
// The gated MLP activations on the device, twins of cpu::situ and cpu::silu_mul
// (cpu/activations.h): the elementwise op (dense/elementwise.cu) and the routed experts' gate
// and up projection, which applies it as it stores (moe/expert_linear_stream.cu).
#include <cuda_runtime.h>

#include "backend/ops.h"

namespace moonrun::cuda {

// The CPU formulas term by term, in the same evaluation order. tanhf/expf are CUDA's
// full-precision versions (a few ulp from glibc's), not the --use_fast_math intrinsics.
__device__ __forceinline__ float situ(float g, float u, float beta, float linear_beta) {
  const float a = beta * tanhf(g / beta) * (1.0f / (1.0f + expf(-g)));
  const float b = linear_beta > 0.0f ? linear_beta * tanhf(u / linear_beta) : u;
  return a * b;
}
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__device__ __forceinline__ float gated_act(float g, float u, const ActivationParams& act) {
  return act.situ ? situ(g, u, act.beta, act.linear_beta) : silu_mul(g, u);
}

}  // namespace moonrun::cuda
