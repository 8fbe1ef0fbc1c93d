#pragma once
// Kimi Delta Attention (K3_SPEC.md §2), written once against the ops (backend/ops.h):
//   q,k,v = SiLU(causal depthwise conv_K(proj(x)))              [T, H*d] each
//   q,k   = per head x / sqrt(sum(x^2) + 1e-6);  q *= d^-1/2
//   g     = gate(f_b(f_a(x)) + dt_bias)   (log decay per head and channel, <= 0)
//   beta  = sigmoid(b_proj(x))                                    [T, H]
//   S_t   = Diag(exp(g_t)) S_{t-1};  S_t += beta_t k_t (v_t - S_t^T k_t)^T;  o_t = S_t^T q_t
//   out   = o_proj(rmsnorm_head(o) * o_norm * sigmoid(gate_out(x)))
// Per sequence the layer keeps, in its state slot, three conv windows [K-1, H*d] and S
// [H, d, d] (F32): K3 0.43 GiB per sequence over 69 layers.
#include <cmath>
#include <cstdint>

#include "backend/ops.h"

namespace moonrun {

struct KdaShape {
  int hidden = 0;
  int num_heads = 0;   // H
  int head_dim = 0;    // d (= d_k = d_v)
  int conv_kernel = 4;
  float norm_eps = 1e-5f;        // o_norm (rms_norm_eps)
  float gate_lower_bound = NAN;  // K3: -5 (safe gate); NaN: Kimi Linear's softplus gate
  int proj_dim() const { return num_heads * head_dim; }
};

struct KdaWeights {
  Matrix q_proj, k_proj, v_proj;      // [H*d, hidden]
  Tensor q_conv, k_conv, v_conv;      // [H*d, K] F32 (checkpoint [H*d, 1, K])
  Tensor A_log;                       // [1, H] F32
  Tensor dt_bias;                     // [1, H*d] F32
  Matrix f_a_proj, f_b_proj;          // [d, hidden], [H*d, d]
  Matrix b_proj;                      // [H, hidden]
  Matrix g_proj;                      // [H*d, hidden] (K3's full-rank output gate), or
  Matrix g_a_proj, g_b_proj;          // [d, hidden], [H*d, d] (Kimi Linear's low-rank gate)
  Tensor o_norm;                      // [1, d] F32
  Matrix o_proj;                      // [hidden, H*d]
};

// Its matrices in the order a step reads them (a prefetch hint's list; issue #41).
inline std::vector<Tensor> kda_weights_read_order(const KdaWeights& k) {
  return {k.q_proj.w, k.k_proj.w, k.v_proj.w, k.f_a_proj.w, k.f_b_proj.w, k.b_proj.w,
          k.g_proj.w, k.g_a_proj.w, k.g_b_proj.w, k.o_proj.w};
}

// The layer's state within a slot: floats, and where each part starts.
int64_t kda_state_floats(const KdaShape& shape);
int64_t kda_conv_window_floats(const KdaShape& shape);  // one of the three windows
// S starts after the three windows.
inline int64_t kda_s_offset(const KdaShape& shape) { return 3 * kda_conv_window_floats(shape); }

// x [T, hidden] act dtype (input_layernorm'ed) -> out [T, hidden] F32. state: this layer's
// region of the slots (kda_state_floats each). Appends the tokens to each sequence's state.
//
// save (speculative decoding): when given, the inputs the state takes from the token rows
// save->rows lists are kept in save->saved for kda_replay: the three projections before the
// short conv (the windows advance over those), the decay gate g and beta.
struct KdaSavedInputs {
  // [n, 1] I32: batch token rows to save (forward; empty: every row, in order) or saved
  // rows to read (replay).
  Tensor rows;
  float* saved = nullptr;  // this layer's region: kda_replay_floats_per_token floats per saved row
  int64_t capacity = 0;    // saved rows the region holds
};
int64_t kda_replay_floats_per_token(const KdaShape& shape);  // 4 * H*d + H
// reduce: sum o_proj's partial outputs over the tensor-parallel group (false: this rank holds
// every head, DP attention).
void kda_forward(Ops& ops, const KdaWeights& w, const KdaShape& shape, const Tensor& x, const BatchView& batch,
                 StateLayer state, KdaMode mode, Tensor out, const KdaSavedInputs* save = nullptr,
                 bool reduce = true);
// Advances each sequence of `batch` (its state slot restored to a snapshot) over its tokens,
// token i from saved row from.rows[i]: the windows over the saved projections, S over the
// conv outputs with the saved g and beta, exactly as kda_forward would have advanced it.
void kda_replay(Ops& ops, const KdaWeights& w, const KdaShape& shape, const BatchView& batch, StateLayer state,
                KdaMode mode, const KdaSavedInputs& from);

}  // namespace moonrun
