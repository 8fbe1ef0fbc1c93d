#include "model/layers/mla.h"

namespace moonrun {

MlaQueries mla_queries_and_store(Ops& ops, const MlaWeights& w, const MlaDims& dims, const Tensor& x,
                                 const BatchView& batch, KvLayer cache, const Tensor& rope_cos_sin) {
  const int64_t T = x.rows, H = dims.attn.num_heads, L = dims.attn.kv_lora, R = dims.attn.rope;
  MlaQueries out;

  // Queries [T, H*(nope+rope)].
  out.q = ops.scratch(T, H * dims.q_head_dim(), DType::F32);
  if (dims.q_lora_rank > 0) {
    Tensor qa = ops.scratch(T, dims.q_lora_rank, DType::F32);
    ops.linear(x, w.q_a_proj, qa);
    out.q_latent = ops.act_dtype() == DType::F32 ? qa : ops.scratch(T, dims.q_lora_rank, ops.act_dtype());
    ops.rmsnorm(qa, w.q_a_layernorm, dims.q_a_norm_eps, out.q_latent);
    ops.linear(out.q_latent, w.q_b_proj, out.q);
  } else {
    ops.linear(x, w.q_proj, out.q);
  }

  // The new cache rows [RMSNorm(latent) | k_pe].
  Tensor ckv = ops.scratch(T, L + R, DType::F32);
  ops.linear(x, w.kv_a_proj_with_mqa, ckv);
  if (!rope_cos_sin.empty()) {  // rotary on each head's q_pe and the one shared k_pe
    ops.rope_interleaved(out.q, rope_cos_sin, static_cast<int>(H), dims.q_head_dim(), dims.attn.nope);
    ops.rope_interleaved(ckv, rope_cos_sin, 1, static_cast<int>(L + R), static_cast<int>(L));
  }
  ops.mla_store(ckv, w.kv_a_layernorm, dims.kv_a_norm_eps, batch, cache);
  return out;
}

void mla_output(Ops& ops, const MlaWeights& w, const MlaDims& dims, const Tensor& x, const Tensor& o, Tensor out) {
  const int64_t T = x.rows, H = dims.attn.num_heads;
  Tensor o_in = o;  // the o_proj input
  if (dims.output_gate) {
    Tensor gate = ops.scratch(T, H * dims.attn.v_dim, DType::F32);
    ops.linear(x, w.g_proj, gate);
    ops.sigmoid(gate);
    o_in = ops.scratch(T, H * dims.attn.v_dim, ops.act_dtype());
    ops.mul(o, gate, o_in);
  } else if (ops.act_dtype() != DType::F32) {
    o_in = ops.scratch(T, H * dims.attn.v_dim, ops.act_dtype());
    ops.copy(o, o_in);
  }
  ops.linear(o_in, w.o_proj, out);
  if (dims.reduce_output) ops.all_reduce_sum(out);  // o_proj is row-parallel: each rank's heads contribute
}

void mla_forward(Ops& ops, const MlaWeights& w, const MlaDims& dims, const Tensor& x, const BatchView& batch,
                 KvLayer cache, MlaMode mode, Tensor out, const Tensor& rope_cos_sin) {
  ScratchScope scope(ops);
  const MlaQueries q = mla_queries_and_store(ops, w, dims, x, batch, cache, rope_cos_sin);
  Tensor o = ops.scratch(x.rows, static_cast<int64_t>(dims.attn.num_heads) * dims.attn.v_dim, DType::F32);  // [T, H*v]
  ops.mla_attention(q.q, w.kv_b_proj, batch, cache, dims.attn, mode, o);
  mla_output(ops, w, dims, x, o, out);
}

}  // namespace moonrun
