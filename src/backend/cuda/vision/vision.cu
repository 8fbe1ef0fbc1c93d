// The vision tower's kernels (twins of backend/cpu/vision.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/vision/vision_ops.h"

namespace moonrun::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// The CPU formulas term by term (cpu::gelu_tanh, cpu::gelu_exact).
__device__ __forceinline__ float gelu_tanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}
__device__ __forceinline__ float gelu_exact(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }

template <typename Out>
__global__ void gelu_kernel(const float* x, int64_t n, bool tanh_approx, Out* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(y + i, tanh_approx ? gelu_tanh(x[i]) : gelu_exact(x[i]));
}

template <typename Out>
void launch_gelu(const float* x, int64_t n, bool tanh_approx, Out* y, cudaStream_t stream) {
  if (n <= 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16));
  gelu_kernel<<<blocks, kThreads, 0, stream>>>(x, n, tanh_approx, y);
  CUDA_CHECK_LAUNCH();
}

constexpr int kMaxPairsPerLane = kMaxVisionHeadDim / 2 / 32;

// One warp per (query row, head). Lane l owns rotary pairs l, l + 32, ...: it rotates its
// share of q once and of each key as it goes, the warp sums the dot product with shuffles,
// and the softmax runs online (running max and sum) so no score row is stored.
__global__ void vision_attention_kernel(const float* qkv, const float* rope, int first, int n, int num_heads,
                                        int head_dim, float scale, float* out) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= n * num_heads) return;
  const int i = first + warp / num_heads, h = warp % num_heads;
  const int64_t width = static_cast<int64_t>(num_heads) * head_dim;
  const int pairs = head_dim / 2;

  float q0[kMaxPairsPerLane], q1[kMaxPairsPerLane], acc0[kMaxPairsPerLane], acc1[kMaxPairsPerLane];
  const float* qrow = qkv + i * 3 * width + h * head_dim;
  const float* rq = rope + static_cast<int64_t>(i) * head_dim;
#pragma unroll
  for (int s = 0; s < kMaxPairsPerLane; ++s) {
    const int p = lane + 32 * s;
    q0[s] = q1[s] = acc0[s] = acc1[s] = 0.0f;
    if (p < pairs) {
      const float c = rq[2 * p], sn = rq[2 * p + 1], x0 = qrow[2 * p], x1 = qrow[2 * p + 1];
      q0[s] = x0 * c - x1 * sn;
      q1[s] = x0 * sn + x1 * c;
    }
  }
  float running_max = -INFINITY, sum = 0.0f;
  for (int j = first; j < first + n; ++j) {
    const float* krow = qkv + j * 3 * width + width + h * head_dim;
    const float* rk = rope + static_cast<int64_t>(j) * head_dim;
    float dot = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxPairsPerLane; ++s) {
      const int p = lane + 32 * s;
      if (p < pairs) {
        const float c = rk[2 * p], sn = rk[2 * p + 1], x0 = krow[2 * p], x1 = krow[2 * p + 1];
        dot += q0[s] * (x0 * c - x1 * sn) + q1[s] * (x0 * sn + x1 * c);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float score = dot * scale;
    const float new_max = fmaxf(running_max, score);
    const float rescale = expf(running_max - new_max);  // 0 on the first key
    const float weight = expf(score - new_max);
    sum = sum * rescale + weight;
    running_max = new_max;
    const float* vrow = qkv + j * 3 * width + 2 * width + h * head_dim;
#pragma unroll
    for (int s = 0; s < kMaxPairsPerLane; ++s) {
      const int p = lane + 32 * s;
      if (p < pairs) {
        acc0[s] = acc0[s] * rescale + weight * vrow[2 * p];
        acc1[s] = acc1[s] * rescale + weight * vrow[2 * p + 1];
      }
    }
  }
  float* o = out + i * width + h * head_dim;
#pragma unroll
  for (int s = 0; s < kMaxPairsPerLane; ++s) {
    const int p = lane + 32 * s;
    if (p < pairs) {
      o[2 * p] = acc0[s] / sum;
      o[2 * p + 1] = acc1[s] / sum;
    }
  }
}

}  // namespace

void gelu(const float* x, int64_t n, bool tanh_approx, float* y, cudaStream_t stream) {
  launch_gelu(x, n, tanh_approx, y, stream);
}
void gelu(const float* x, int64_t n, bool tanh_approx, bf16* y, cudaStream_t stream) {
  launch_gelu(x, n, tanh_approx, y, stream);
}

void vision_attention(const float* qkv, const float* rope, int first, int n, int num_heads, int head_dim, float* out,
                      cudaStream_t stream) {
  if (n <= 0) return;
  const int warps = n * num_heads, warps_per_block = kThreads / 32;
  const int blocks = (warps + warps_per_block - 1) / warps_per_block;
  vision_attention_kernel<<<blocks, kThreads, 0, stream>>>(qkv, rope, first, n, num_heads, head_dim,
                                                           1.0f / sqrtf(static_cast<float>(head_dim)), out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
