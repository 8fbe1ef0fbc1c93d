#pragma once
// Gated multi-head latent attention's attention step on the CPU, float32 (K3_SPEC.md §2),
// one sequence per call; the CPU backend (cpu_ops.cpp) loops over a batch's sequences and
// the layer around it is written once in model/layers/mla.cpp. The cache holds, per token,
// the normalised latent (kv_lora) followed by k_pe (rope dims, never rotated in K3 / Kimi
// Linear): 576 floats per token per layer at K3 size.
//
// Two evaluation orders of the same math:
//   plain    — expand kv_b over every cached row (per-head keys and values), then attend.
//   absorbed — fold W_uk (the k_nope rows of kv_b) into the query and W_uv (the v rows) into
//              the output, so each head attends directly over the [kv_lora | pe] rows:
//              q_h . key_h(p) = (W_uk_h^T q_nope_h) . c(p) + q_pe_h . k_pe(p)
//              o_h            = W_uv_h (sum_p a_p c(p))
#include "backend/cpu/linear.h"
#include "backend/ops.h"

namespace moonrun::cpu {

// rows[p] points at the cache row (kv_lora + rope floats) of position p, for p in
// [0, n_past + n_tokens) (the new rows already written). q [n_tokens, H, nope + rope];
// kv_b [H * (nope + v), kv_lora]; o [n_tokens, H, v]. Causal: new token t sees [0, n_past + t].
//
// selected (DeepSeek Sparse Attention): when not null, new token t reads only the positions
// in selected[t * selected_cols, + selected_cols), which lie in its causal range and end at
// the first -1; plain order masks the others' scores to -inf as the reference does, absorbed
// order visits only those rows. One code path for dense and sparse keeps them the same math.
void mla_attend_plain(const float* q, const float* kv_b, const MlaShape& shape, int n_tokens, int n_past,
                      const float* const* rows, float* o, const int32_t* selected = nullptr, int selected_cols = 0);
void mla_attend_absorbed(const float* q, const float* kv_b, const MlaShape& shape, int n_tokens, int n_past,
                         const float* const* rows, float* o, const int32_t* selected = nullptr,
                         int selected_cols = 0);

}  // namespace moonrun::cpu
