#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace moonrun::cpu {

void moe_forward(const MoeWeights& w, const MoeDims& dims, const float* x, int n_tokens, float* out) {
  const int H = dims.hidden, D = dims.io_dim, E = dims.router.num_experts, K = dims.router.top_k;

  // Routing from the full-width x, in fp32.
  std::vector<float> logits(static_cast<size_t>(n_tokens) * E);  // [n_tokens, E]
  apply(w.router, x, n_tokens, logits.data());
  std::vector<int> ids(static_cast<size_t>(n_tokens) * K);        // [n_tokens, K]
  std::vector<float> weights(ids.size());                         // [n_tokens, K]
  for (int t = 0; t < n_tokens; ++t)
    route_token(&logits[static_cast<size_t>(t) * E], w.router_bias.empty() ? nullptr : w.router_bias.data(),
                dims.router, &ids[static_cast<size_t>(t) * K], &weights[static_cast<size_t>(t) * K]);

  // Into the latent space.
  std::vector<float> z;  // [n_tokens, D]
  const float* expert_in = x;
  if (!w.latent_down.empty()) {
    z.resize(static_cast<size_t>(n_tokens) * D);
    apply(w.latent_down, x, n_tokens, z.data());
    expert_in = z.data();
  }

  // Each chosen expert runs once over the tokens that picked it (the reference's moe_infer
  // grouping); the outputs are summed per token in top-k order.
  std::vector<float> expert_out(static_cast<size_t>(n_tokens) * K * D);  // [n_tokens, K, D]
  std::vector<std::vector<int>> slots(E);  // per expert: flat (t*K + k) slots that chose it
  for (int s = 0; s < n_tokens * K; ++s) slots[ids[s]].push_back(s);
  std::vector<float> gathered, result;
  for (int e = 0; e < E; ++e) {
    const auto& sl = slots[e];
    if (sl.empty()) continue;
    const int n = static_cast<int>(sl.size());
    gathered.resize(static_cast<size_t>(n) * D);
    result.resize(static_cast<size_t>(n) * D);
    for (int j = 0; j < n; ++j) {
      const float* src = expert_in + static_cast<size_t>(sl[j] / K) * D;
      std::copy(src, src + D, gathered.begin() + static_cast<size_t>(j) * D);
    }
    mlp_forward(w.experts[e], dims.act, gathered.data(), n, result.data());
    for (int j = 0; j < n; ++j)
      std::copy(result.begin() + static_cast<size_t>(j) * D, result.begin() + static_cast<size_t>(j + 1) * D,
                expert_out.begin() + static_cast<size_t>(sl[j]) * D);
  }
  std::vector<float> y(static_cast<size_t>(n_tokens) * D, 0.0f);  // [n_tokens, D]
  for (int t = 0; t < n_tokens; ++t) {
    float* yt = &y[static_cast<size_t>(t) * D];
    for (int k = 0; k < K; ++k) {
      const float wk = weights[static_cast<size_t>(t) * K + k];
      const float* o = &expert_out[(static_cast<size_t>(t) * K + k) * D];
      for (int c = 0; c < D; ++c) yt[c] += o[c] * wk;
    }
  }

  // Back to full width.
  if (!w.latent_up.empty()) {
    if (!w.latent_norm.empty()) rmsnorm(y.data(), n_tokens, D, w.latent_norm.data(), dims.norm_eps, y.data());
    apply(w.latent_up, y.data(), n_tokens, out);
  } else {
    std::copy(y.begin(), y.end(), out);
  }
  if (!w.shared.empty()) {
    std::vector<float> shared(static_cast<size_t>(n_tokens) * H);  // [n_tokens, hidden]
    mlp_forward(w.shared, dims.act, x, n_tokens, shared.data());
    for (size_t i = 0; i < shared.size(); ++i) out[i] += shared[i];
  }
}

}  // namespace moonrun::cpu
