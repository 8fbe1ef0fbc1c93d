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
#include <algorithm>

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
//
// kv_splits (absorbed order; split-KV, issue 47): each query's keys in that many contiguous
// ranges, each range's softmax partial (its max m_r, its sum l_r and its weighted sum of rows)
// computed apart, in parallel over (head, range), and combined in range order:
// o_lat = sum_r e^(m_r - M) acc_r / sum_r e^(m_r - M) l_r, M the largest m_r. The CUDA decode
// kernel's split-KV and combine pass; equal to one range within fp32 rounding (its test).
void mla_attend_absorbed(const float* q, const float* kv_b, const MlaShape& shape, int n_tokens, int n_past,
                         const float* const* rows, float* o, const int32_t* selected = nullptr,
                         int selected_cols = 0, int kv_splits = 1);

// The ranges the CPU backend splits a decode token's keys into: one a 4,096 keys, at most 16,
// from the key count alone (so the result does not depend on the machine's thread count).
inline int mla_cpu_kv_splits(int n_keys) { return std::clamp(n_keys / 4096, 1, 16); }

}  // namespace moonrun::cpu
