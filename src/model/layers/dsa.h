#pragma once
// Gated DeepSeek Sparse Attention (Kimi K3.1's full-attention layers; issue 38), written once
// against the ops: K3's gated MLA (layers/mla.h) whose attention reads, per query, only the
// keys a lightning indexer picks (DeepSeek-V3.2-Exp inference/model.py Indexer; transformers
// models/deepseek_v32), without the indexer's RoPE (K3.1 has none):
//   q_I[t]   = wq_b(q_latent[t])            [n_heads, head_dim]  (q_latent = RMSNorm(q_a(x)), MLA's)
//   k_I[s]   = LayerNorm(wk(x[s]))          [head_dim]           cached per token (its own pool)
//   w[t]     = weights_proj(x[t])           [n_heads]
//   I[t, s]  = sum_h w[t, h] (n_heads head_dim)^-1/2 ReLU(q_I[t, h] . k_I[s]),  s <= pos_t
//   keys(t)  = the top index_topk positions by I[t, .] (all of them when pos_t + 1 <= index_topk)
//   o        = MLA over keys(t) only, then MLA's gate and o_proj.
// The CPU reference always scores and selects, even where everything fits (selecting every
// visible key is dense attention: the test that ties this layer to K3's runs this path).
#include "backend/ops.h"
#include "model/layers/mla.h"

namespace moonrun {

// One DSA layer's indexer, under "<layer>.self_attn.indexer." (model/kimi_k31.h lists them).
struct DsaIndexerWeights {
  Matrix wq_b;          // [n_heads * head_dim, q_lora_rank]
  Matrix wk;            // [head_dim, hidden]
  Tensor k_norm;        // [1, head_dim] F32 (LayerNorm weight)
  Tensor k_norm_bias;   // [1, head_dim] F32
  Matrix weights_proj;  // [n_heads, hidden]
};

struct DsaDims {
  DsaIndexerShape indexer;  // heads, head_dim
  int topk = 0;             // index_topk: keys each query reads
  float k_norm_eps = 1e-6f;  // the key LayerNorm's eps (K3.1: rms_norm_eps)
  // The index scores are made and selected from a block of the step's tokens at a time,
  // [rows, columns] F32 within this many bytes (at least one row): a prefill chunk of 8,192
  // tokens at 262,144 positions would otherwise hold 8.6 GB of scores. Every row is scored
  // and selected on its own, so the blocks change nothing but the memory.
  int64_t score_block_bytes = kDefaultScoreBlockBytes;
  static constexpr int64_t kDefaultScoreBlockBytes = int64_t{64} << 20;
};

// DsaDims::score_block_bytes as a model sets it: the default, or MOONRUN_DSA_SCORE_BLOCK_BYTES
// (tests make blocks of a few rows with it).
int64_t dsa_score_block_bytes();
// Step scratch a DSA layer adds for tokens_per_step new tokens (Model::scratch_bytes): a
// block of scores, the selection, the indexer's q, weights and keys.
int64_t dsa_scratch_bytes(const DsaDims& dsa, int tokens_per_step);

// The columns of a step's index scores [T, columns]: a power of two (at least 256, one
// block of the CUDA scores kernel) no smaller than any of `batch`'s sequences' positions,
// n_past + n_new. Not the exact context: a decode step captured as a graph replays for
// later positions, so what its shapes depend on must hold for a range of contexts (the
// kernels read each token's own position from the device tables and mask past it); the
// runner keys graphs by it (Model::graph_variant).
int64_t dsa_score_columns(const ForwardBatch& batch);

// x [T, hidden] act dtype (input_layernorm'ed) -> out [T, hidden] F32. Writes the new tokens'
// latent rows into `latent` and their indexer keys into `keys` (this layer's pages of each
// pool, one page table), then attends over each query's selected rows.
void dsa_forward(Ops& ops, const MlaWeights& w, const DsaIndexerWeights& iw, const MlaDims& mla, const DsaDims& dsa,
                 const Tensor& x, const BatchView& batch, KvLayer latent, KvLayer keys, MlaMode mode, Tensor out);

}  // namespace moonrun
