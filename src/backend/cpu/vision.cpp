#include "backend/cpu/vision.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moonrun::cpu {

float gelu_tanh(float x) {
  // torch: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

float gelu_exact(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }

void gelu(const float* x, int64_t n, bool tanh_approx, float* y) {
  if (tanh_approx) {
    for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh(x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = gelu_exact(x[i]);
  }
}

namespace {

// Pair i of a head row rotated by (cos, sin) = rope[2i], rope[2i+1]: the complex product
// (x0 + i x1)(c + i s), as the reference's view_as_complex multiply.
void rotate(const float* x, const float* rope, int head_dim, float* y) {
  for (int i = 0; i < head_dim / 2; ++i) {
    const float c = rope[2 * i], s = rope[2 * i + 1];
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    y[2 * i] = x0 * c - x1 * s;
    y[2 * i + 1] = x0 * s + x1 * c;
  }
}

}  // namespace

void vision_attention(const float* qkv, const float* rope, std::span<const int32_t> seq_starts, int num_heads,
                      int head_dim, float* out) {
  const int64_t width = static_cast<int64_t>(num_heads) * head_dim;  // one of q, k, v
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> q, k, scores;
  for (size_t s = 0; s + 1 < seq_starts.size(); ++s) {
    const int64_t first = seq_starts[s], n = seq_starts[s + 1] - first;
    if (n <= 0) continue;
    q.resize(static_cast<size_t>(n) * width);
    k.resize(static_cast<size_t>(n) * width);
    scores.resize(static_cast<size_t>(n));
    // The rotated queries and keys of this image, [n, H*d] each.
    for (int64_t t = 0; t < n; ++t) {
      const float* row = qkv + (first + t) * 3 * width;
      const float* r = rope + (first + t) * head_dim;
      for (int h = 0; h < num_heads; ++h) {
        rotate(row + h * head_dim, r, head_dim, &q[t * width + h * head_dim]);
        rotate(row + width + h * head_dim, r, head_dim, &k[t * width + h * head_dim]);
      }
    }
    for (int h = 0; h < num_heads; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        const float* qi = &q[i * width + h * head_dim];
        float max_score = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = &k[j * width + h * head_dim];
          float dot = 0.0f;
          for (int c = 0; c < head_dim; ++c) dot += qi[c] * kj[c];
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        float* o = out + (first + i) * width + h * head_dim;
        std::fill(o, o + head_dim, 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float p = scores[j] / sum;
          const float* vj = qkv + (first + j) * 3 * width + 2 * width + h * head_dim;
          for (int c = 0; c < head_dim; ++c) o[c] += p * vj[c];
        }
      }
    }
  }
}

}  // namespace moonrun::cpu
