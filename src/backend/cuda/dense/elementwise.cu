// Elementwise ops: the gated activations (twins of cpu::situ and cpu::silu_mul in
// cpu/activations.h), the residual add and the fp32 -> bf16 cast.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/dense/dense_ops.h"

namespace moonrun::cuda {
namespace {

constexpr int kThreads = 256;

// Enough blocks to fill the GPU several times over; the kernels stride over the rest.
int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::min<int64_t>(blocks, 132 * 16));
}

// The CPU formulas term by term, in the same evaluation order. tanhf/expf are CUDA's
// full-precision versions (a few ulp from glibc's), not the --use_fast_math intrinsics.
__device__ __forceinline__ float situ(float g, float u, float beta, float linear_beta) {
  const float a = beta * tanhf(g / beta) * (1.0f / (1.0f + expf(-g)));
  const float b = linear_beta > 0.0f ? linear_beta * tanhf(u / linear_beta) : u;
  return a * b;
}
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__global__ void situ_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n, float beta,
                            float linear_beta, bf16* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(situ(gate[i], up[i], beta, linear_beta));
}

__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                              bf16* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(silu_mul(gate[i], up[i]));
}

// y may alias a or b: each element is read before it is written, by the same thread.
__global__ void add_kernel(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n, bf16* __restrict__ y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

}  // namespace

void gated_activation(const float* gate, const float* up, int64_t n, const cpu::ActivationParams& act, bf16* out,
                      cudaStream_t stream) {
  if (n <= 0) return;
  if (act.situ) {
    situ_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, act.beta, act.linear_beta, out);
  } else {
    swiglu_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, out);
  }
  CUDA_CHECK_LAUNCH();
}

void add(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, b, n, y);
  CUDA_CHECK_LAUNCH();
}

void to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t stream) {
  if (n <= 0) return;
  to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
