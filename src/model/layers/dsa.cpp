#include "model/layers/dsa.h"

#include <algorithm>
#include <cstdlib>

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

  // Scores over the step's context width (dsa_score_columns), a block of tokens at a time
  // (DsaDims::score_block_bytes); each query's top k of its causal range. Past a query's
  // position its scores are -inf and its selection -1: a selection as wide as the columns
  // when they are fewer than index_topk lists the same keys.
  const int64_t columns = dsa_score_columns(*batch.host);
  const int64_t block_rows = std::clamp<int64_t>(dsa.score_block_bytes / (columns * 4), 1, std::max<int64_t>(T, 1));
  Tensor selected = ops.scratch(T, std::min<int64_t>(dsa.topk, columns), DType::I32);
  Tensor scores = ops.scratch(std::min(block_rows, T), columns, DType::F32);
  for (int64_t t0 = 0; t0 < T; t0 += block_rows) {
    const int64_t n = std::min(block_rows, T - t0);
    const Tensor block = scores.rows_view(0, n);
    ops.dsa_index_scores(qi.rows_view(t0, n), wi.rows_view(t0, n), batch, keys, dsa.indexer, block, static_cast<int>(t0));
    ops.dsa_topk(block, batch, selected.rows_view(t0, n), static_cast<int>(t0));
  }

  Tensor o = ops.scratch(T, static_cast<int64_t>(mla.attn.num_heads) * mla.attn.v_dim, DType::F32);
  ops.mla_sparse_attention(q.q, w.kv_b_proj, batch, latent, mla.attn, mode, selected, o);
  mla_output(ops, w, mla, x, o, out);
}

int64_t dsa_score_block_bytes() {
  const char* env = std::getenv("MOONRUN_DSA_SCORE_BLOCK_BYTES");
  if (!env || !*env) return DsaDims::kDefaultScoreBlockBytes;
  const long long v = std::strtoll(env, nullptr, 10);
  return v > 0 ? v : DsaDims::kDefaultScoreBlockBytes;
}

int64_t dsa_scratch_bytes(const DsaDims& dsa, int tokens_per_step) {
  const int64_t T = std::max(tokens_per_step, 1);
  const int64_t heads = dsa.indexer.num_heads, dim = dsa.indexer.head_dim;
  return dsa.score_block_bytes + int64_t{4} * (T * dsa.topk + T * (heads * dim + heads + dim)) + (int64_t{1} << 20);
}

int64_t dsa_score_columns(const ForwardBatch& batch) {
  int64_t context = 1;
  for (const BatchSeq& s : batch.seqs) context = std::max<int64_t>(context, int64_t{s.n_past} + s.n_new);
  int64_t columns = 256;
  while (columns < context) columns *= 2;
  return columns;
}

}  // namespace moonrun
