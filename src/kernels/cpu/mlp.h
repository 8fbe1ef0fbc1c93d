#pragma once
// The gated MLP: down(act(gate(x), up(x))). Used by the dense first layer, the shared
// experts, and each routed expert (w1 = gate, w3 = up, w2 = down).
#include "kernels/cpu/linear.h"

namespace moonrun::cpu {

struct ActivationParams {
  bool situ = true;          // false: SwiGLU (silu(g) * u)
  float beta = 4.0f;         // activation_situ_beta
  float linear_beta = 25.0f; // activation_situ_linear_beta (0: none)
};

struct MlpWeights {
  Linear gate;  // [inter, in]
  Linear up;    // [inter, in]
  Linear down;  // [in, inter]
  bool empty() const { return gate.empty(); }
};

// x: [n_tokens, in] -> out: [n_tokens, in].
void mlp_forward(const MlpWeights& w, const ActivationParams& act, const float* x, int n_tokens,
                 float* out);

}  // namespace moonrun::cpu
