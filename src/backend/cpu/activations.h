#pragma once
// The gated MLP activations, float32 (K3_SPEC.md §2).
#include <cmath>
#include <cstdint>

#include "backend/ops.h"

namespace moonrun::cpu {

// SiTU (K3, hidden_act "situ"): beta*tanh(g/beta)*sigmoid(g) * lin*tanh(u/lin); lin = 0 leaves
// u untouched (activation_situ_linear_beta null).
inline float situ(float g, float u, float beta, float linear_beta) {
  float a = beta * std::tanh(g / beta) * (1.0f / (1.0f + std::exp(-g)));
  float b = linear_beta > 0.0f ? linear_beta * std::tanh(u / linear_beta) : u;
  return a * b;
}

// SwiGLU (Kimi Linear, hidden_act "silu"): silu(g) * u.
inline float silu_mul(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

// y = act(gate, up) elementwise; y may alias gate or up.
inline void gated_activation(const float* gate, const float* up, int64_t n, const ActivationParams& act, float* y) {
  if (act.situ) {
    for (int64_t i = 0; i < n; ++i) y[i] = situ(gate[i], up[i], act.beta, act.linear_beta);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = silu_mul(gate[i], up[i]);
  }
}

}  // namespace moonrun::cpu
