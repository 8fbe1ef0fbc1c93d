#include "kernels/cpu/mlp.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/cpu/activations.h"

namespace moonrun::cpu {

void mlp_forward(const MlpWeights& w, const ActivationParams& act, const float* x, int n_tokens,
                 float* out) {
  const int inter = w.gate.out_features;
  std::vector<float> g(static_cast<size_t>(n_tokens) * inter);  // [n_tokens, inter]
  std::vector<float> u(g.size());                               // [n_tokens, inter]
  apply(w.gate, x, n_tokens, g.data());
  apply(w.up, x, n_tokens, u.data());
  if (act.situ) {
    for (size_t i = 0; i < g.size(); ++i) g[i] = situ(g[i], u[i], act.beta, act.linear_beta);
  } else {
    for (size_t i = 0; i < g.size(); ++i) g[i] = silu_mul(g[i], u[i]);
  }
  apply(w.down, g.data(), n_tokens, out);
}

}  // namespace moonrun::cpu
