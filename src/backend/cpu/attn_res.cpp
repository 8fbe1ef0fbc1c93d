#include "backend/cpu/attn_res.h"

#include <cmath>
#include <vector>

namespace moonrun::cpu {

void attn_res_mix(const float* prefix, const float* const* blocks, int n_blocks, int n_tokens,
                  int hidden, const float* w_norm, const float* w_proj, float eps, float* out) {
  std::vector<float> score_weight(hidden);  // [hidden] norm weight folded into the projection
  for (int c = 0; c < hidden; ++c) score_weight[c] = w_norm[c] * w_proj[c];
  const int n_v = n_blocks + 1;
  std::vector<const float*> v(n_v);
  std::vector<float> score(n_v);
  std::vector<float> mixed(hidden);
  for (int t = 0; t < n_tokens; ++t) {
    const int64_t off = static_cast<int64_t>(t) * hidden;
    for (int i = 0; i < n_blocks; ++i) v[i] = blocks[i] + off;
    v[n_blocks] = prefix + off;
    float max_score = -INFINITY;
    for (int i = 0; i < n_v; ++i) {
      double ss = 0, dot = 0;
      for (int c = 0; c < hidden; ++c) {
        ss += static_cast<double>(v[i][c]) * v[i][c];
        dot += static_cast<double>(v[i][c]) * score_weight[c];
      }
      const float inv_rms = 1.0f / std::sqrt(static_cast<float>(ss / hidden) + eps);
      score[i] = static_cast<float>(dot) * inv_rms;
      max_score = std::max(max_score, score[i]);
    }
    float denom = 0;
    for (int i = 0; i < n_v; ++i) denom += (score[i] = std::exp(score[i] - max_score));
    for (int c = 0; c < hidden; ++c) mixed[c] = 0;
    for (int i = 0; i < n_v; ++i) {
      const float p = score[i] / denom;
      for (int c = 0; c < hidden; ++c) mixed[c] += p * v[i][c];
    }
    for (int c = 0; c < hidden; ++c) out[off + c] = mixed[c];
  }
}

}  // namespace moonrun::cpu
