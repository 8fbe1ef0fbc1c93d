#pragma once
// Kimi Delta Attention's pieces on the CPU, float32 (K3_SPEC.md §2; FLA fla/ops/kda/naive.py
// is the reference for the recurrence and the chunked WY form). One sequence per call: the
// CPU backend (cpu_ops.cpp) loops over a batch's sequences; the layer that strings them
// together is written once, in model/layers/kda.cpp.
#include <cmath>
#include <cstdint>

#include "backend/cpu/linear.h"

namespace moonrun::cpu {

// Causal depthwise conv over [n_tokens, dim] with a rolling window [K-1, dim] (the K-1
// inputs before this call, oldest first), then SiLU when apply_silu; the window is advanced.
void short_conv(const float* x, int n_tokens, int dim, const float* weight, int kernel, float* window,
                bool apply_silu, float* y);
inline void short_conv_silu(const float* x, int n_tokens, int dim, const float* weight, int kernel, float* window,
                            float* y) {
  short_conv(x, n_tokens, dim, weight, kernel, window, true, y);
}

// FLA's l2norm per row of d values: x * scale / sqrt(sum(x^2) + 1e-6), in place.
void l2norm_rows(float* x, int64_t n_rows, int d, float scale);

// The decay gate in place over g [n_tokens, H*d] (raw f_b(f_a(x)) on entry): raw += dt_bias;
// K3 (lower_bound finite): lower_bound * sigmoid(exp(A_log[h]) raw); Kimi Linear (NaN):
// -exp(A_log[h]) softplus(raw).
void kda_gate(float* g, int n_tokens, int num_heads, int head_dim, const float* A_log, const float* dt_bias,
              float lower_bound);

// FusedRMSNormGated(sigmoid) per head row of d: y = w * o / sqrt(mean(o^2) + eps) * sigmoid(gate).
void gated_rmsnorm(const float* o, const float* gate, const float* w, int64_t n_rows, int d, float eps, float* y);

// The recurrence for all heads: q, k [T, H, d] (L2-normalised, q pre-scaled), v [T, H, d],
// g [T, H, d] log-decay (<= 0), beta [T, H]; S [H, d, d] in/out; o [T, H, d].
void kda_recurrent(const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int n_tokens, int num_heads, int head_dim, float* S,
                   float* o);
void kda_chunked(const float* q, const float* k, const float* v, const float* g,
                 const float* beta, int n_tokens, int num_heads, int head_dim, float* S,
                 float* o, int chunk_size = 64);

}  // namespace moonrun::cpu
