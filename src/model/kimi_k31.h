#pragma once
// Kimi K3.1 (moonshotai/Kimi-K3.1-Pro; issue 38): K3's text model (model/kimi_k3.h) whose
// full-attention layers use gated DeepSeek Sparse Attention: K3's gated MLA projections plus
// a lightning indexer that picks, per query, the top `index_topk` keys the attention reads.
// This step lists the indexer's tensors (for verify, plan and the loader to come); the
// sparse-attention forward is issue 38's next step, so the family row has no build yet.
//
// What exists now for that forward (issue 38, build item 2, CPU only): the backend ops
// dsa_index_store (LayerNorm'd indexer keys into their own paged pool on the latent cache's
// pages), dsa_index_scores, dsa_topk and mla_sparse_attention (backend/ops.h; CPU in
// backend/cpu/dsa.h and MLA's own kernels with a selection), tested against double loops
// from DeepSeek-V3.2-Exp's Indexer in tests/unit/backend/dsa_ops_test.cpp. Not yet: the
// indexer pool in the cache's row kinds (plan, prefix cache, snapshots, preemption), the
// layer that calls the ops, reference fixtures, and CUDA (those ops throw there).
//
// The indexer of one DSA layer, under "<layer>.self_attn.indexer.", as DeepSeek-V3.2's
// Indexer (transformers models/deepseek_v32, DeepSeek-V3.2-Exp inference/model.py) names
// and shapes it, without RoPE (the issue: "no RoPE"):
//   wq_b.weight          [index_n_heads * index_head_dim, q_lora_rank]  query from the q latent
//   wk.weight            [index_head_dim, hidden]                        one key head (MQA)
//   k_norm.{weight,bias} [index_head_dim]                                LayerNorm, eps rms_norm_eps
//   weights_proj.weight  [index_n_heads, hidden]                         per-head weights
// all BF16 as stored (K3's quantization_config leaves self_attn.* unquantized).
//
// Shard rule: every indexer tensor is replicated on every TP rank. The indexer is small
// (14.9 MB a layer in K3.1-Pro, 0.36 GB in all), its key is one head that cannot be split by
// heads, and each query's top-k needs the score summed over all 32 heads: split heads would
// need an all-reduce of a [tokens x context] score matrix per layer before the top-k, far
// more traffic than holding 15 MB per layer on every rank.
#include <vector>

#include "backend/tensor.h"
#include "model/kimi_k3.h"
#include "model/weight_spec.h"

namespace moonrun {

struct DsaIndexerWeights {
  Matrix wq_b;          // [n_heads * head_dim, q_lora_rank]
  Matrix wk;            // [head_dim, hidden]
  Tensor k_norm;        // [1, head_dim] F32 (LayerNorm weight)
  Tensor k_norm_bias;   // [1, head_dim] F32
  Matrix weights_proj;  // [n_heads, hidden]
};

struct KimiK31Weights {
  KimiK3Weights k3;
  std::vector<DsaIndexerWeights> indexers;  // [num_dsa_layers], by LayerSpec::dsa_index
};

// The one listing of K3.1's tensors: K3's (describe_kimi_k3_weights), then each DSA
// layer's indexer.
void describe_kimi_k31_weights(const ModelConfig& cfg, KimiK31Weights& w, WeightSink& sink);

}  // namespace moonrun
