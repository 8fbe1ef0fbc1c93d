// KDA's elementwise pieces on the GPU (twins of backend/cpu/kda.h): the per-head L2 norm of
// q and k, the decay gate, and the gated RMSNorm before o_proj. All fp32 math; the gated
// norm writes the o_proj input in the act dtype.
#include <cuda_runtime.h>

#include <cmath>

#include "common/check.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/kda/kda_internal.cuh"
#include "backend/cuda/kda/kda_ops.h"

namespace moonrun::cuda {

namespace {

using kda_detail::warp_allreduce_sum;

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;  // row kernels: a warp per head row

unsigned blocks_for(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch's softplus with threshold 20, as cpu::softplus.
__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// FLA's l2norm over each head row: x * scale / sqrt(sum(x^2) + 1e-6). x [n_rows, d] in place.
__global__ void l2norm_rows_kernel(float* x, int64_t n_rows, int d, float scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_rows) return;  // whole warps leave together
  float* xr = x + row * d;
  float ss = 0.0f;
  // An explicit fma (what nvcc contracts this to anyway): replay_inputs.cu sums the same way.
  for (int i = lane; i < d; i += 32) ss = __fmaf_rn(xr[i], xr[i], ss);
  ss = warp_allreduce_sum(ss);
  const float inv = scale / sqrtf(ss + 1e-6f);
  for (int i = lane; i < d; i += 32) xr[i] *= inv;
}

// The decay gate in place: g [T, H*d] holds f_b(f_a(x)) on entry, the log decay on exit.
// lower_bound finite: K3's safe gate lb * sigmoid(exp(A_log) raw); NaN: Kimi Linear's
// -exp(A_log) softplus(raw).
__global__ void decay_gate_kernel(float* g, int n_tokens, int H, int d, const float* __restrict__ A_log,
                                  const float* __restrict__ dt_bias, float lower_bound) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int D = H * d;
  if (idx >= static_cast<int64_t>(n_tokens) * D) return;
  const int hi = static_cast<int>(idx % D);  // h * d + i
  const float a = expf(A_log[hi / d]);
  const float raw = g[idx] + dt_bias[hi];
  g[idx] = isnan(lower_bound) ? -a * softplusf(raw) : lower_bound * sigmoidf(a * raw);
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// FusedRMSNormGated(sigmoid): y = weight * o / sqrt(mean(o^2) + eps) * sigmoid(gate), per head
// row of d; o, gate [n_rows, d] fp32, y the o_proj input.
template <typename Out>
__global__ void gated_rmsnorm_kernel(const float* __restrict__ o, const float* __restrict__ gate,
                                     const float* __restrict__ weight, int64_t n_rows, int d, float eps,
                                     Out* __restrict__ y) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_rows) return;
  const float* orow = o + row * d;
  float ss = 0.0f;
  for (int i = lane; i < d; i += 32) ss += orow[i] * orow[i];
  ss = warp_allreduce_sum(ss);
  const float inv = 1.0f / sqrtf(ss / d + eps);
  for (int i = lane; i < d; i += 32)
    store(y + row * d + i, weight[i] * (orow[i] * inv) * sigmoidf(gate[row * d + i]));
}

template <typename Out>
void gated_rmsnorm_impl(const float* o, const float* gate, const float* w, int64_t n_rows, int d, float eps, Out* y,
                        cudaStream_t stream) {
  if (n_rows <= 0) return;
  gated_rmsnorm_kernel<Out><<<blocks_for(n_rows, kRowsPerBlock), kThreads, 0, stream>>>(o, gate, w, n_rows, d, eps, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void l2norm_rows(float* x, int64_t n_rows, int d, float scale, cudaStream_t stream) {
  if (n_rows <= 0) return;
  l2norm_rows_kernel<<<blocks_for(n_rows, kRowsPerBlock), kThreads, 0, stream>>>(x, n_rows, d, scale);
  CUDA_CHECK_LAUNCH();
}

void kda_gate(float* g, int n_tokens, int num_heads, int head_dim, const float* A_log, const float* dt_bias,
              float lower_bound, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(n_tokens) * num_heads * head_dim;
  if (n <= 0) return;
  decay_gate_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(g, n_tokens, num_heads, head_dim, A_log,
                                                                     dt_bias, lower_bound);
  CUDA_CHECK_LAUNCH();
}

void gated_rmsnorm(const float* o, const float* gate, const float* w, int64_t n_rows, int d, float eps, bf16* y,
                   cudaStream_t stream) {
  gated_rmsnorm_impl(o, gate, w, n_rows, d, eps, y, stream);
}
void gated_rmsnorm(const float* o, const float* gate, const float* w, int64_t n_rows, int d, float eps, float* y,
                   cudaStream_t stream) {
  gated_rmsnorm_impl(o, gate, w, n_rows, d, eps, y, stream);
}

}  // namespace moonrun::cuda
