// Token embedding and RMSNorm: the twins of cpu::embed_tokens (cpu/embedding.h) and
// cpu::rmsnorm (cpu/linear.cpp).
#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/dense/block_reduce.cuh"
#include "backend/cuda/dense/dense_ops.h"

namespace moonrun::cuda {
namespace {

constexpr int kRowThreads = 256;  // one block per row: 28 values per thread at hidden 7168

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(bf16 v) { return __bfloat162float(v); }

// out[t, :] = float(table[ids[t] - first_row, :]), or zeros when this (vocab-parallel)
// table does not hold that id; grid: n_tokens.
template <typename Table>
__global__ void embed_kernel(const Table* __restrict__ table, int64_t first_row, int64_t n_rows, int hidden,
                             const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int t = blockIdx.x;
  const int64_t r = static_cast<int64_t>(ids[t]) - first_row;
  float* dst = out + static_cast<int64_t>(t) * hidden;
  if (r < 0 || r >= n_rows) {
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) dst[c] = 0.0f;
    return;
  }
  const Table* row = table + r * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) dst[c] = widen(row[c]);
}

template <typename Table>
void embed_impl(const Table* table, int64_t first_row, int64_t n_rows, int hidden, const int32_t* ids, int n_tokens,
                float* out, cudaStream_t stream) {
  if (n_tokens <= 0 || hidden <= 0) return;
  embed_kernel<Table><<<n_tokens, kRowThreads, 0, stream>>>(table, first_row, n_rows, hidden, ids, out);
  CUDA_CHECK_LAUNCH();
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// y[r] = w * (x[r] * inv_rms(x[r])); grid: n_rows. The same arithmetic as the CPU, step by
// step: the sum of squares in double (each square is exact in double, so only the summation
// order differs), mean in double, then float: 1 / sqrt(float(ss / dim) + eps), and
// w * (x * inv) with two roundings (no FMA can form: there is no add).
template <typename Out>
__global__ void rmsnorm_kernel(const float* __restrict__ x, int dim, const float* __restrict__ weight, float eps,
                               Out* __restrict__ y) {
  __shared__ double partial[32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  Out* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  double ss = 0;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += static_cast<double>(xr[c]) * xr[c];
  ss = block_sum(ss, partial);
  const float inv = 1.0f / sqrtf(static_cast<float>(ss / dim) + eps);
  for (int c = threadIdx.x; c < dim; c += blockDim.x)
    store(yr + c, weight ? weight[c] * (xr[c] * inv) : xr[c] * inv);
}

template <typename Out>
void rmsnorm_impl(const float* x, int n_rows, int dim, const float* weight, float eps, Out* y, cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  rmsnorm_kernel<Out><<<n_rows, kRowThreads, 0, stream>>>(x, dim, weight, eps, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void embed_tokens(const bf16* table, int64_t first_row, int64_t n_rows, int hidden, const int32_t* ids, int n_tokens,
                  float* out, cudaStream_t stream) {
  embed_impl(table, first_row, n_rows, hidden, ids, n_tokens, out, stream);
}
void embed_tokens(const float* table, int64_t first_row, int64_t n_rows, int hidden, const int32_t* ids, int n_tokens,
                  float* out, cudaStream_t stream) {
  embed_impl(table, first_row, n_rows, hidden, ids, n_tokens, out, stream);
}

void rmsnorm(const float* x, int n_rows, int dim, const float* weight, float eps, bf16* y, cudaStream_t stream) {
  rmsnorm_impl(x, n_rows, dim, weight, eps, y, stream);
}

void rmsnorm(const float* x, int n_rows, int dim, const float* weight, float eps, float* y, cudaStream_t stream) {
  rmsnorm_impl(x, n_rows, dim, weight, eps, y, stream);
}

}  // namespace moonrun::cuda
