#pragma once
// DeepSeek Sparse Attention's lightning indexer on the CPU, float32 (Kimi K3.1's full-attention
// layers, issue 38; model/kimi_k31.h). One sequence per call; CpuOps loops over a batch's
// sequences. The attention over the selected keys is MLA's own code (cpu/mla.h, with a
// selection), so sparse and dense attention cannot drift apart.
//
// The reference is DeepSeek-V3.2-Exp inference/model.py Indexer (and transformers'
// models/deepseek_v32): weights = weights_proj(x) * n_heads^-1/2 * softmax_scale, softmax_scale
// = head_dim^-1/2, and the fp8_index kernel's score = sum_h weights[h] * ReLU(q_h . k). Its fp8
// quantisation scales (q_scale folded into the weights, k_scale on the sum) multiply back to
// the unquantised product, and its Hadamard rotation of q and k is orthonormal, so in float32
// neither changes the score: neither is done here. K3.1's indexer has no RoPE (issue 38).
#include <cstdint>

#include "backend/ops.h"

namespace moonrun::cpu {

// torch LayerNorm over one row of n: (x - mean) / sqrt(var + eps) * w + b, biased variance,
// in float32 (the reference's LayerNorm computes in x.float()). y may alias x.
void layernorm_row(const float* x, int n, const float* w, const float* b, float eps, float* y);

// Index scores of one sequence's new tokens. q [n_tokens, H * D] (the wq_b output), w
// [n_tokens, H] (the weights_proj output, unscaled), rows[p] the cached key (D floats, after
// k_norm) of position p in [0, n_past + n_tokens). Row t of scores (stride score_stride)
// gets columns [0, n_past + t] (its causal range) and -inf in [n_past + t + 1, score_cols).
void dsa_index_scores(const float* q, const float* w, const DsaIndexerShape& shape, int n_tokens, int n_past,
                      const float* const* rows, float* scores, int64_t score_stride, int score_cols);

// The top k of scores[0, visible) as positions in increasing order, then -1 up to k.
// Highest score first; of equal scores the lower position wins (torch.topk leaves ties
// unspecified, so any fixed rule matches the reference where it is defined). With
// visible <= k every position is kept: dense causal attention.
void dsa_topk_row(const float* scores, int visible, int k, int32_t* out);

}  // namespace moonrun::cpu
