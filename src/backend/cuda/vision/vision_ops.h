#pragma once
// The vision tower's ops on the GPU, twins of backend/cpu/vision.h (the reference): GELU in
// both forms, and bidirectional attention with 2-D rotary embedding inside one image.
// Simple, correct kernels (the tower runs once per image, at admission); all enqueue on
// `stream` and check their launches.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/common/bf16.h"

namespace moonrun::cuda {

// y = GELU(x), tanh approximation or exact erf, n elements; y may alias x (fp32).
void gelu(const float* x, int64_t n, bool tanh_approx, float* y, cudaStream_t stream);
void gelu(const float* x, int64_t n, bool tanh_approx, bf16* y, cudaStream_t stream);

// One image's rows [first, first + n) of qkv [*, 3*H*d] (rows [q | k | v]) attend to each
// other: q and k pairs rotated by rope [*, d] (cos, sin per pair), scores scaled by d^-1/2,
// fp32 softmax; out [*, H*d]. head_dim even and at most kMaxVisionHeadDim.
constexpr int kMaxVisionHeadDim = 256;
void vision_attention(const float* qkv, const float* rope, int first, int n, int num_heads, int head_dim, float* out,
                      cudaStream_t stream);

}  // namespace moonrun::cuda
