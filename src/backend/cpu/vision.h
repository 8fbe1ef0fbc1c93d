#pragma once
// The vision tower's own ops, float32 (backend/ops.h, "the vision tower"): GELU in both of
// the forms MoonViT-V2 uses, and bidirectional attention with 2-D rotary embedding inside
// each image.
#include <cstdint>
#include <span>

namespace moonrun::cpu {

// PyTorch's GELU: approximate="tanh" (gelu_pytorch_tanh) or the exact erf form.
float gelu_tanh(float x);
float gelu_exact(float x);
void gelu(const float* x, int64_t n, bool tanh_approx, float* y);

// qkv [T, 3*H*d] rows [q | k | v]; rope [T, d] (cos, sin) per rotary pair; images are the
// row ranges of seq_starts; out [T, H*d].
void vision_attention(const float* qkv, const float* rope, std::span<const int32_t> seq_starts, int num_heads,
                      int head_dim, float* out);

}  // namespace moonrun::cpu
