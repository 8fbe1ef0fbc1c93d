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

  // Scores over the step's context width (dsa_score_columns); each query's top k of its
  // causal range. [T, columns] grows with the context, unlike everything else a step
  // allocates (ops.h, mla_prefill_key_block): fine for the CPU's growing scratch; the CUDA
  // top-k will stream the scores by blocks of keys instead (issue 38, item 3), so
  // scratch_bytes holds no room for long contexts (its slack covers a few thousand).
  const int64_t columns = dsa_score_columns(*batch.host);
  Tensor scores = ops.scratch(T, columns, DType::F32);
  ops.dsa_index_scores(qi, wi, batch, keys, dsa.indexer, scores);
  // Past a query's position its scores are -inf and its selection -1: a selection as wide
  // as the columns when they are fewer than index_topk lists the same keys.
  Tensor selected = ops.scratch(T, std::min<int64_t>(dsa.topk, columns), DType::I32);
  ops.dsa_topk(scores, batch, selected);

  Tensor o = ops.scratch(T, static_cast<int64_t>(mla.attn.num_heads) * mla.attn.v_dim, DType::F32);
  ops.mla_sparse_attention(q.q, w.kv_b_proj, batch, latent, mla.attn, mode, selected, o);
  mla_output(ops, w, mla, x, o, out);
}

int64_t dsa_score_columns(const ForwardBatch& batch) {
  int64_t context = 1;
  for (const BatchSeq& s : batch.seqs) context = std::max<int64_t>(context, int64_t{s.n_past} + s.n_new);
  int64_t columns = 256;
  while (columns < context) columns *= 2;
  return columns;
}

}  // namespace moonrun
