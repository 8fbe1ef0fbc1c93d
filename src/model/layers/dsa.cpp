#include "model/layers/dsa.h"

#include <algorithm>

namespace moonrun {

void dsa_forward(Ops& ops, const MlaWeights& w, const DsaIndexerWeights& iw, const MlaDims& mla, const DsaDims& dsa,
                 const Tensor& x, const BatchView& batch, KvLayer latent, KvLayer keys, MlaMode mode, Tensor out) {
  ScratchScope scope(ops);
  const int64_t T = x.rows;
  const int64_t HI = dsa.indexer.num_heads, DI = dsa.indexer.head_dim;
  MR_CHECK(mla.q_lora_rank > 0) << "dsa_forward: the indexer's wq_b reads the q latent (q_lora_rank > 0)";

  // MLA's queries and latent rows, as the dense layer makes them.
  const MlaQueries q = mla_queries_and_store(ops, w, mla, x, batch, latent);

  // The indexer: this step's keys into their pool first, so each query scores its own token too.
  Tensor k = ops.scratch(T, DI, DType::F32);
  ops.linear(x, iw.wk, k);
  ops.dsa_index_store(k, iw.k_norm, iw.k_norm_bias, dsa.k_norm_eps, batch, keys);
  Tensor qi = ops.scratch(T, HI * DI, DType::F32);
  ops.linear(q.q_latent, iw.wq_b, qi);
  Tensor wi = ops.scratch(T, HI, DType::F32);
  ops.linear(x, iw.weights_proj, wi);

  // Scores over the longest sequence's positions; each query's top k of its causal range.
  // [T, context] grows with the context, unlike everything else a step allocates (ops.h,
  // mla_prefill_key_block): fine for the CPU's growing scratch; the CUDA top-k will stream
  // the scores by blocks of keys instead (issue 38, item 3), so scratch_bytes holds no room.
  int context = 1;
  for (const BatchSeq& s : batch.host->seqs) context = std::max(context, s.n_past + s.n_new);
  Tensor scores = ops.scratch(T, context, DType::F32);
  ops.dsa_index_scores(qi, wi, batch, keys, dsa.indexer, scores);
  // No query sees more than `context` keys: a narrower selection lists the same keys.
  Tensor selected = ops.scratch(T, std::min(dsa.topk, context), DType::I32);
  ops.dsa_topk(scores, batch, selected);

  Tensor o = ops.scratch(T, static_cast<int64_t>(mla.attn.num_heads) * mla.attn.v_dim, DType::F32);
  ops.mla_sparse_attention(q.q, w.kv_b_proj, batch, latent, mla.attn, mode, selected, o);
  mla_output(ops, w, mla, x, o, out);
}

}  // namespace moonrun
