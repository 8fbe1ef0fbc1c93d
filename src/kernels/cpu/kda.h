#pragma once
// Kimi Delta Attention on the CPU (K3_SPEC.md §2; FLA fla/ops/kda/naive.py is the
// reference for the recurrence and the chunked WY form). One sequence at a time; the
// caller loops over the sequences of a batch.
#include <cmath>
#include <vector>

#include "kernels/cpu/linear.h"

namespace moonrun::cpu {

struct KdaDims {
  int hidden = 0;       // model hidden size
  int num_heads = 0;    // H
  int head_dim = 0;     // d (= d_k = d_v)
  int conv_kernel = 4;  // short conv window
  float norm_eps = 1e-5f;              // o_norm eps (config rms_norm_eps)
  float gate_lower_bound = NAN;        // K3: -5 (safe gate); NaN: Kimi Linear softplus gate
  int proj_dim() const { return num_heads * head_dim; }
};

struct KdaWeights {
  Linear q_proj, k_proj, v_proj;               // [H*d, hidden]
  std::vector<float> q_conv, k_conv, v_conv;   // [H*d, conv_kernel] (checkpoint [H*d, 1, K])
  std::vector<float> A_log;                    // [H]
  std::vector<float> dt_bias;                  // [H*d]
  Linear f_a_proj;                             // [d, hidden]
  Linear f_b_proj;                             // [H*d, d]
  Linear b_proj;                               // [H, hidden]
  Linear g_proj;                               // [H*d, hidden]  (use_full_rank_gate)
  Linear g_a_proj, g_b_proj;                   // [d, hidden], [H*d, d] (low-rank output gate)
  std::vector<float> o_norm;                   // [d]
  Linear o_proj;                               // [hidden, H*d]
};

// Per-sequence state of one KDA layer.
struct KdaCache {
  // The last conv_kernel-1 rows of the conv inputs (the q/k/v projections before the conv),
  // oldest first: [conv_kernel-1, H*d] each; zeros for a new sequence.
  std::vector<float> conv_q, conv_k, conv_v;
  std::vector<float> S;  // [H, d_k, d_v] fp32 recurrent state; zeros for a new sequence
  void reset(const KdaDims& dims);
};

enum class KdaMode {
  kAuto,       // recurrent when n_tokens == 1, chunked otherwise (what the reference does)
  kRecurrent,  // token by token
  kChunked,    // the WY chunked form, chunk 64
};

// out[t] = o_proj(o_norm(attn_t) * sigmoid(gate_t)) for the n_tokens rows of x.
// x: [n_tokens, hidden] (already input_layernorm'ed), out: [n_tokens, hidden].
// Updates cache (conv windows and S) as if the tokens were appended to the sequence.
void kda_forward(const KdaWeights& w, const KdaDims& dims, const float* x, int n_tokens,
                 KdaCache& cache, float* out, KdaMode mode = KdaMode::kAuto);

// The pieces, exposed for the op tests (and the CUDA twins' references):
// Causal depthwise conv + SiLU over [n_tokens, dim] with a rolling window [K-1, dim].
void short_conv_silu(const float* x, int n_tokens, int dim, const float* weight, int kernel,
                     float* window, float* y);
// The recurrence for all heads: q, k [T, H, d] (L2-normalised, q pre-scaled), v [T, H, d],
// g [T, H, d] log-decay (<= 0), beta [T, H]; S [H, d, d] in/out; o [T, H, d].
void kda_recurrent(const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int n_tokens, int num_heads, int head_dim, float* S,
                   float* o);
void kda_chunked(const float* q, const float* k, const float* v, const float* g,
                 const float* beta, int n_tokens, int num_heads, int head_dim, float* S,
                 float* o, int chunk_size = 64);

}  // namespace moonrun::cpu
