#include "backend/cpu/moe.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "backend/cpu/activations.h"
#include "backend/cpu/linear.h"

namespace moonrun::cpu {

void gated_mlp(const float* x, int n_tokens, int in, const ExpertF32& w, const ActivationParams& act, float* out) {
  const int inter = w.inter;
  std::vector<float> g(static_cast<size_t>(n_tokens) * inter);  // [n_tokens, inter]
  std::vector<float> u(g.size());                               // [n_tokens, inter]
  matmul_xwT(x, n_tokens, in, w.gate, inter, g.data());
  matmul_xwT(x, n_tokens, in, w.up, inter, u.data());
  gated_activation(g.data(), u.data(), static_cast<int64_t>(g.size()), act, g.data());
  matmul_xwT(g.data(), n_tokens, inter, w.down, in, out);
}

void moe_experts(const float* x, int n_tokens, int in, const int32_t* ids, const float* weights, int top_k,
                 int first_expert, int num_experts, const ExpertSource& expert, const ActivationParams& act,
                 float* y) {
  const int D = in, K = top_k;
  std::vector<float> expert_out(static_cast<size_t>(n_tokens) * K * D);  // [n_tokens, K, D]; zero: not held here
  std::vector<std::vector<int>> slots(num_experts);  // per expert: flat (t*K + k) slots that chose it
  for (int s = 0; s < n_tokens * K; ++s) {
    const int e = ids[s] - first_expert;
    if (e >= 0 && e < num_experts) slots[e].push_back(s);
  }
  std::vector<float> gathered, result;
  for (int e = 0; e < num_experts; ++e) {
    const auto& sl = slots[e];
    if (sl.empty()) continue;
    const int n = static_cast<int>(sl.size());
    gathered.resize(static_cast<size_t>(n) * D);
    result.resize(static_cast<size_t>(n) * D);
    for (int j = 0; j < n; ++j) {
      const float* src = x + static_cast<size_t>(sl[j] / K) * D;
      std::copy(src, src + D, gathered.begin() + static_cast<size_t>(j) * D);
    }
    gated_mlp(gathered.data(), n, D, expert(e), act, result.data());
    for (int j = 0; j < n; ++j)
      std::copy(result.begin() + static_cast<size_t>(j) * D, result.begin() + static_cast<size_t>(j + 1) * D,
                expert_out.begin() + static_cast<size_t>(sl[j]) * D);
  }
  std::fill(y, y + static_cast<size_t>(n_tokens) * D, 0.0f);
  for (int t = 0; t < n_tokens; ++t) {
    float* yt = y + static_cast<size_t>(t) * D;
    for (int k = 0; k < K; ++k) {
      const float wk = weights[static_cast<size_t>(t) * K + k];
      const float* o = &expert_out[(static_cast<size_t>(t) * K + k) * D];
      for (int c = 0; c < D; ++c) yt[c] += o[c] * wk;
    }
  }
}

}  // namespace moonrun::cpu
