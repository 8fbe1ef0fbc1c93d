// The DSA lightning indexer on the CPU, float32 (the math and its reference are in dsa.h).
#include "backend/cpu/dsa.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/linear.h"
#include "common/check.h"

namespace moonrun::cpu {

void layernorm_row(const float* x, int n, const float* w, const float* b, float eps, float* y) {
  float mean = 0;
  for (int i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<float>(n);
  float var = 0;
  for (int i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(var + eps);
  for (int i = 0; i < n; ++i) y[i] = (x[i] - mean) * inv * w[i] + b[i];
}

void dsa_index_scores(const float* q, const float* w, const DsaIndexerShape& shape, int n_tokens, int n_past,
                      const float* const* rows, float* scores, int64_t score_stride, int score_cols) {
  const int H = shape.num_heads, D = shape.head_dim;
  MR_CHECK(n_past + n_tokens <= score_cols) << "dsa_index_scores: " << n_past + n_tokens
                                            << " positions but scores has " << score_cols << " columns";
  const float scale = shape.weight_scale();
  // Tokens are independent; each reads every visible key once per head (MQA: one key head).
  parallel_heads(n_tokens, static_cast<int64_t>(n_past + n_tokens) * H * D, [&](int t) {
    const int visible = n_past + t + 1;
    const float* qt = q + static_cast<int64_t>(t) * H * D;
    std::vector<float> wt(H);
    for (int h = 0; h < H; ++h) wt[h] = w[static_cast<int64_t>(t) * H + h] * scale;
    float* st = scores + t * score_stride;
    for (int p = 0; p < visible; ++p) {
      float s = 0;
      for (int h = 0; h < H; ++h) s += wt[h] * std::max(0.0f, dot(qt + static_cast<int64_t>(h) * D, rows[p], D));
      st[p] = s;
    }
    std::fill(st + visible, st + score_cols, -std::numeric_limits<float>::infinity());
  });
}

void dsa_topk_row(const float* scores, int visible, int k, int32_t* out) {
  const int n = std::min(visible, k);
  std::vector<int32_t> pos(visible);
  std::iota(pos.begin(), pos.end(), 0);
  if (visible > k) {
    // A strict total order (score descending, then position ascending) makes the chosen set
    // unique whatever nth_element does with equal elements.
    std::nth_element(pos.begin(), pos.begin() + k, pos.end(), [&](int32_t a, int32_t b) {
      return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
    });
    std::sort(pos.begin(), pos.begin() + k);
  }
  // Increasing position: the attention then reads the cache in order, and with every
  // position kept it sums in the dense attention's order.
  std::copy(pos.begin(), pos.begin() + n, out);
  std::fill(out + n, out + k, -1);
}

}  // namespace moonrun::cpu
