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
// table does not hold that id; grid: n_tokens. vec8: 8 values a load (one 16-byte load of
// bf16, two of fp32) where the row and pointers allow - a one-token step is one row, and
// scalar loads left it latency-bound (13 us for 7168 values on an H200).
template <typename Table>
__global__ void embed_kernel(const Table* __restrict__ table, int64_t first_row, int64_t n_rows, int hidden,
                             const int32_t* __restrict__ ids, bool vec8, float* __restrict__ out) {
  const int t = blockIdx.x;
  const int64_t r = static_cast<int64_t>(ids[t]) - first_row;
  float* dst = out + static_cast<int64_t>(t) * hidden;
  const bool miss = r < 0 || r >= n_rows;
  const Table* row = table + (miss ? 0 : r) * hidden;
  if (vec8) {
    for (int c = 8 * threadIdx.x; c < hidden; c += 8 * blockDim.x) {
      float v[8] = {};
      if (!miss) {
        if constexpr (sizeof(Table) == 2) {
          const uint4 w = *reinterpret_cast<const uint4*>(row + c);
          const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            v[2 * i] = bf16_lo(words[i]);
            v[2 * i + 1] = bf16_hi(words[i]);
          }
        } else {
          const float4 a = *reinterpret_cast<const float4*>(row + c), b = *reinterpret_cast<const float4*>(row + c + 4);
          v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        }
      }
      *reinterpret_cast<float4*>(dst + c) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(dst + c + 4) = make_float4(v[4], v[5], v[6], v[7]);
    }
    return;
  }
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) dst[c] = miss ? 0.0f : widen(row[c]);
}

template <typename Table>
void embed_impl(const Table* table, int64_t first_row, int64_t n_rows, int hidden, const int32_t* ids, int n_tokens,
                float* out, cudaStream_t stream) {
  if (n_tokens <= 0 || hidden <= 0) return;
  const bool vec8 = hidden % 8 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % 16 == 0;
  embed_kernel<Table><<<n_tokens, kRowThreads, 0, stream>>>(table, first_row, n_rows, hidden, ids, vec8, out);
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

// The same arithmetic with the row held in registers, four values a load: thread i owns
// float4 chunks i, i + blockDim, ... (at most kChunks; vec_row_launch, block_reduce.cuh).
// Decode normalises a handful of rows, one block each; the loop above reads them 28
// dependent loads deep per thread and then again for the output (14 us a 7168-wide row on an H200, ten times a K3 layer pair).
// Here all of a thread's loads are in flight at once, the row is read once, and a few rows
// get 1024 threads each.
__device__ __forceinline__ void store4(float* p, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(bf16* p, float a, float b, float c, float d) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  uint2 w;
  w.x = *reinterpret_cast<const uint32_t*>(&lo);
  w.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = w;
}

template <typename Out, int kChunks>
__global__ void __launch_bounds__(vec_row_max_threads(kChunks))
    rmsnorm_vec_kernel(const float* __restrict__ x, int dim, const float* __restrict__ weight, float eps,
                       Out* __restrict__ y) {
  __shared__ double partial[32];
  const int n4 = dim / 4;
  const float4* xr = reinterpret_cast<const float4*>(x + static_cast<int64_t>(blockIdx.x) * dim);
  Out* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float4 v[kChunks];
  double ss = 0;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < n4) v[i] = xr[c];
  }
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < n4)
      ss += static_cast<double>(v[i].x) * v[i].x + static_cast<double>(v[i].y) * v[i].y +
            static_cast<double>(v[i].z) * v[i].z + static_cast<double>(v[i].w) * v[i].w;
  }
  ss = block_sum(ss, partial);
  const float inv = 1.0f / sqrtf(static_cast<float>(ss / dim) + eps);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c >= n4) continue;
    float4 w = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    if (weight) w = reinterpret_cast<const float4*>(weight)[c];
    const float a = v[i].x * inv, b = v[i].y * inv, cc = v[i].z * inv, d = v[i].w * inv;
    if (weight)
      store4(yr + 4 * c, w.x * a, w.y * b, w.z * cc, w.w * d);
    else
      store4(yr + 4 * c, a, b, cc, d);
  }
}

template <typename Out>
void rmsnorm_impl(const float* x, int n_rows, int dim, const float* weight, float eps, Out* y, cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  const bool aligned = dim % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(weight) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(y) % (4 * sizeof(Out)) == 0;
  const VecRowLaunch vec = aligned ? vec_row_launch(n_rows, dim / 4) : VecRowLaunch{};
  if (vec.chunks == 2)
    rmsnorm_vec_kernel<Out, 2><<<n_rows, vec.threads, 0, stream>>>(x, dim, weight, eps, y);
  else if (vec.chunks == 8)
    rmsnorm_vec_kernel<Out, 8><<<n_rows, vec.threads, 0, stream>>>(x, dim, weight, eps, y);
  else
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
