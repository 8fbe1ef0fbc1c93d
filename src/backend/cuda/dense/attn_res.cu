// The Attention-Residuals depth mix on the GPU, the twin of cpu::attn_res_mix
// (cpu/attn_res.cpp; K3_SPEC.md §2). Per token, independently of every other token:
//   V = [blocks[0], ..., blocks[n_blocks - 1], prefix]           each [hidden]
//   score_i = (sum_c V_i[c] * w_norm[c] * w_proj[c]) / rms(V_i)    (norm without weight)
//   out = sum_i softmax(score)_i * V_i
#include <cmath>
#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/dense/block_reduce.cuh"
#include "backend/cuda/dense/dense_ops.h"

namespace moonrun::cuda {
namespace {

constexpr int kMixThreads = 256;

// The depth softmax over the n scores in place, in float and in index order (one thread).
__device__ __forceinline__ void softmax_in_order(float* w, int n) {
  float max_score = -INFINITY;
  for (int i = 0; i < n; ++i) max_score = fmaxf(max_score, w[i]);
  float denom = 0;
  for (int i = 0; i < n; ++i) denom += (w[i] = expf(w[i] - max_score));
  for (int i = 0; i < n; ++i) w[i] = w[i] / denom;
}

// grid: n_tokens; dynamic shared memory: the n_blocks + 1 scores, then weights (padded, see
// attn_res_mix).
// The arithmetic follows the CPU's step by step: sums of squares and of V * (w_norm * w_proj)
// in double (the float product w_norm * w_proj first, as the CPU folds it), the score in
// float, the softmax in float in index order on one thread, and the mix accumulated in
// index order with explicit roundings (__fmul_rn / __fadd_rn: no FMA, which the CPU's
// x86-64 baseline code does not form either).
// blocks: block i's row t at blocks + (i * n_tokens + t) * hidden.
__global__ void attn_res_mix_kernel(const float* prefix, const float* __restrict__ blocks, int n_blocks, int n_tokens,
                                    int hidden, const float* __restrict__ w_norm, const float* __restrict__ w_proj,
                                    float eps, float* out) {
  extern __shared__ float weight[];  // [n_blocks + 1]
  __shared__ double partial[32];
  const int n_v = n_blocks + 1;
  const int64_t off = static_cast<int64_t>(blockIdx.x) * hidden;
  for (int i = 0; i < n_v; ++i) {
    const float* v = i < n_blocks ? blocks + (static_cast<int64_t>(i) * n_tokens) * hidden + off : prefix + off;
    double ss = 0, dot = 0;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      const double x = v[c];
      ss += x * x;
      dot += x * static_cast<double>(__fmul_rn(w_norm[c], w_proj[c]));
    }
    ss = block_sum(ss, partial);
    dot = block_sum(dot, partial);
    if (threadIdx.x == 0) {
      const float inv_rms = 1.0f / sqrtf(static_cast<float>(ss / hidden) + eps);
      weight[i] = static_cast<float>(dot) * inv_rms;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) softmax_in_order(weight, n_v);
  __syncthreads();
  // Each thread reads V_i[c] for its own c before writing out[c]: out may alias prefix.
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float mixed = 0;
    for (int i = 0; i < n_v; ++i) {
      const float* v = i < n_blocks ? blocks + (static_cast<int64_t>(i) * n_tokens) * hidden + off : prefix + off;
      mixed = __fadd_rn(mixed, __fmul_rn(weight[i], v[c]));
    }
    out[off + c] = mixed;
  }
}

// The same arithmetic with the rows in float4 chunks (vec_row_launch, block_reduce.cuh; at
// most kMaxMixInputs vectors): the kernel above walks the vectors one after the
// other, each two block reductions and 28 dependent loads a thread deep (27 us a token at
// K3's width, six times a layer pair). Here every vector's chunks are loaded four values at
// a time, each warp reduces its partial sums with shuffles only, and one barrier joins all
// the vectors' sums. Thread i owns float4 chunks i, i + blockDim, ... throughout.
constexpr int kMaxMixInputs = 16;

__device__ __forceinline__ double dot4(float4 a, float4 b) {
  return static_cast<double>(a.x) * b.x + static_cast<double>(a.y) * b.y + static_cast<double>(a.z) * b.z +
         static_cast<double>(a.w) * b.w;
}

template <int kChunks>
__global__ void __launch_bounds__(vec_row_max_threads(kChunks))
    attn_res_mix_vec_kernel(const float* prefix, const float* __restrict__ blocks, int n_blocks, int n_tokens,
                            int hidden, const float* __restrict__ w_norm, const float* __restrict__ w_proj, float eps,
                            float* out) {
  __shared__ double sums[kMaxMixInputs][32][2];  // [vector][warp][ss, dot]
  __shared__ float weight[kMaxMixInputs];
  const int n_v = n_blocks + 1, n4 = hidden / 4, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n_warps = blockDim.x / 32;
  const int64_t off = static_cast<int64_t>(blockIdx.x) * hidden;
  auto vec = [&](int i) {
    return reinterpret_cast<const float4*>(
        i < n_blocks ? blocks + (static_cast<int64_t>(i) * n_tokens) * hidden + off : prefix + off);
  };
  float4 wp[kChunks];  // w_norm * w_proj, the float product first as the CPU folds it
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c >= n4) continue;
    const float4 a = reinterpret_cast<const float4*>(w_norm)[c], b = reinterpret_cast<const float4*>(w_proj)[c];
    wp[k] = make_float4(__fmul_rn(a.x, b.x), __fmul_rn(a.y, b.y), __fmul_rn(a.z, b.z), __fmul_rn(a.w, b.w));
  }
#pragma unroll 2
  for (int i = 0; i < n_v; ++i) {
    const float4* v = vec(i);
    float4 x[kChunks];
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < n4) x[k] = v[c];
    }
    double ss = 0, dot = 0;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c >= n4) continue;
      ss += dot4(x[k], x[k]);
      dot += dot4(x[k], wp[k]);
    }
    ss = warp_sum(ss);
    dot = warp_sum(dot);
    if (lane == 0) {
      sums[i][warp][0] = ss;
      sums[i][warp][1] = dot;
    }
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < n_v) {
    const int i = threadIdx.x;
    double ss = 0, dot = 0;
    for (int w = 0; w < n_warps; ++w) {
      ss += sums[i][w][0];
      dot += sums[i][w][1];
    }
    const float inv_rms = 1.0f / sqrtf(static_cast<float>(ss / hidden) + eps);
    weight[i] = static_cast<float>(dot) * inv_rms;
  }
  __syncthreads();
  if (threadIdx.x == 0) softmax_in_order(weight, n_v);
  __syncthreads();
  // Each thread reads V_i of its own chunks before writing them: out may alias prefix.
  float4 mixed[kChunks];
#pragma unroll
  for (int k = 0; k < kChunks; ++k) mixed[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int i = 0; i < n_v; ++i) {
    const float4* v = vec(i);
    const float wi = weight[i];
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c >= n4) continue;
      const float4 x = v[c];
      mixed[k].x = __fadd_rn(mixed[k].x, __fmul_rn(wi, x.x));
      mixed[k].y = __fadd_rn(mixed[k].y, __fmul_rn(wi, x.y));
      mixed[k].z = __fadd_rn(mixed[k].z, __fmul_rn(wi, x.z));
      mixed[k].w = __fadd_rn(mixed[k].w, __fmul_rn(wi, x.w));
    }
  }
  float4* o = reinterpret_cast<float4*>(out + off);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < n4) o[c] = mixed[k];
  }
}

}  // namespace

void attn_res_mix(const float* prefix, const float* blocks, int n_blocks, int n_tokens, int hidden,
                  const float* w_norm, const float* w_proj, float eps, float* out, cudaStream_t stream) {
  if (n_tokens <= 0 || hidden <= 0) return;
  if (n_blocks < 0) throw CudaError("attn_res_mix: n_blocks < 0");
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const VecRowLaunch vec = hidden % 4 == 0 && n_blocks + 1 <= kMaxMixInputs && aligned(prefix) && aligned(blocks) &&
                                   aligned(w_norm) && aligned(w_proj) && aligned(out)
                               ? vec_row_launch(n_tokens, hidden / 4)
                               : VecRowLaunch{};
  if (vec.chunks != 0) {
    if (vec.chunks == 2)
      attn_res_mix_vec_kernel<2><<<n_tokens, vec.threads, 0, stream>>>(prefix, blocks, n_blocks, n_tokens, hidden,
                                                                       w_norm, w_proj, eps, out);
    else
      attn_res_mix_vec_kernel<8><<<n_tokens, vec.threads, 0, stream>>>(prefix, blocks, n_blocks, n_tokens, hidden,
                                                                       w_norm, w_proj, eps, out);
    CUDA_CHECK_LAUNCH();
    return;
  }
  // Padded by a few floats: nvcc unrolls the depth loop and loads shared memory a few
  // entries ahead of the bound (harmless on the hardware, but compute-sanitizer flags reads
  // past the allocation).
  const size_t shared_bytes = static_cast<size_t>((n_blocks + 1 + 3) / 4 * 4 + 8) * sizeof(float);
  attn_res_mix_kernel<<<n_tokens, kMixThreads, shared_bytes, stream>>>(prefix, blocks, n_blocks, n_tokens, hidden,
                                                                       w_norm, w_proj, eps, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
