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
  if (threadIdx.x == 0) {
    float max_score = -INFINITY;
    for (int i = 0; i < n_v; ++i) max_score = fmaxf(max_score, weight[i]);
    float denom = 0;
    for (int i = 0; i < n_v; ++i) denom += (weight[i] = expf(weight[i] - max_score));
    for (int i = 0; i < n_v; ++i) weight[i] = weight[i] / denom;
  }
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

}  // namespace

void attn_res_mix(const float* prefix, const float* blocks, int n_blocks, int n_tokens, int hidden,
                  const float* w_norm, const float* w_proj, float eps, float* out, cudaStream_t stream) {
  if (n_tokens <= 0 || hidden <= 0) return;
  if (n_blocks < 0) throw CudaError("attn_res_mix: n_blocks < 0");
  // Padded by a few floats: nvcc unrolls the depth loop and loads shared memory a few
  // entries ahead of the bound (harmless on the hardware, but compute-sanitizer flags reads
  // past the allocation).
  const size_t shared_bytes = static_cast<size_t>((n_blocks + 1 + 3) / 4 * 4 + 8) * sizeof(float);
  attn_res_mix_kernel<<<n_tokens, kMixThreads, shared_bytes, stream>>>(prefix, blocks, n_blocks, n_tokens, hidden,
                                                                       w_norm, w_proj, eps, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
