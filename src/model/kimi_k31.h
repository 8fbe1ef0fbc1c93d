#pragma once
// Kimi K3.1 (moonshotai/Kimi-K3.1-Pro; issue 38): K3's text model (model/kimi_k3.h) whose
// full-attention layers use gated DeepSeek Sparse Attention: K3's gated MLA projections plus
// a lightning indexer that picks, per query, the top `index_topk` keys the attention reads.
// The forward is K3's (model/kimi_k3.cpp) with the DSA layer (model/layers/dsa.h) in each
// full-attention layer; the indexer keys are a row kind of the paged cache beside the
// latent rows (CacheSpec::index_layers), so the prefix cache and preemption, which hand out
// and share pages, carry them with the latent rows. CPU only: the CUDA ops throw (issue 38,
// item 3).
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
#include "model/layers/dsa.h"
#include "model/weight_spec.h"

namespace moonrun {

struct KimiK31Weights {
  KimiK3Weights k3;
  std::vector<DsaIndexerWeights> indexers;  // [num_dsa_layers], by LayerSpec::dsa_index
};

// The one listing of K3.1's tensors: K3's (describe_kimi_k3_weights), then each DSA
// layer's indexer.
void describe_kimi_k31_weights(const ModelConfig& cfg, KimiK31Weights& w, WeightSink& sink,
                               const WeightLayout& layout = {});

}  // namespace moonrun
