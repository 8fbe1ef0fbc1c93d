#pragma once
// Gated multi-head latent attention with NoPE (K3_SPEC.md §2), written once against the ops:
//   q           = q_b(RMSNorm(q_a(x)))  or  q_proj(x)           [T, H, nope | pe]
//   [c | k_pe]  = kv_a_proj_with_mqa(x);  c = RMSNorm(c)         the cache row [kv_lora | pe]
//   [k_nope|v]  = kv_b(c)  per head;  key = [k_nope | k_pe]      (k_pe shared by all heads)
//   o_h         = softmax_causal(q_h . key_h * (nope+pe)^-1/2) v_h
//   out         = o_proj(o * sigmoid(g_proj(x)))   (the gate only when mla_use_output_gate)
// K3: no rotary anywhere, the "rope" slice is used as is. The K2 family (DeepSeek-V3) turns
// q_pe and k_pe by rotary embeddings (interleaved pairs, Ops::rope_interleaved) before the
// cache row is stored and the scores taken: pass the tokens' cos/sin rows. Per token per
// layer the paged cache keeps one row of kv_lora + rope values (576 at K3 size).
#include "backend/ops.h"

namespace moonrun {

struct MlaDims {
  int hidden = 0;
  int q_lora_rank = 0;  // 0: no q LoRA (q_proj)
  MlaShape attn;        // heads, kv_lora, nope, rope, v
  bool output_gate = false;
  float q_a_norm_eps = 1e-6f, kv_a_norm_eps = 1e-6f;
  // Sum o_proj's partial outputs over the tensor-parallel group (false: this rank holds
  // every head, DP attention).
  bool reduce_output = true;
  int q_head_dim() const { return attn.nope + attn.rope; }
};

struct MlaWeights {
  Matrix q_a_proj;          // [q_lora, hidden]
  Tensor q_a_layernorm;     // [1, q_lora] F32
  Matrix q_b_proj;          // [H*(nope+rope), q_lora]
  Matrix q_proj;            // [H*(nope+rope), hidden] when q_lora_rank == 0
  Matrix kv_a_proj_with_mqa;  // [kv_lora+rope, hidden]
  Tensor kv_a_layernorm;    // [1, kv_lora] F32
  Matrix kv_b_proj;         // [H*(nope+v), kv_lora]
  Matrix o_proj;            // [hidden, H*v]
  Matrix g_proj;            // [H*v, hidden] when output_gate
};

// Its matrices in the order a step reads them (a prefetch hint's list; issue #41).
inline std::vector<Tensor> mla_weights_read_order(const MlaWeights& m) {
  return {m.q_a_proj.w, m.q_b_proj.w, m.q_proj.w, m.kv_a_proj_with_mqa.w, m.kv_b_proj.w, m.g_proj.w, m.o_proj.w};
}

// x [T, hidden] act dtype (input_layernorm'ed) -> out [T, hidden] F32. Writes the new
// tokens' rows into `cache` (this layer's pages) and attends over each sequence's rows.
// rope_cos_sin [T, rope] F32 (model/layers/rope.h) turns q_pe and k_pe; empty: no rotary.
void mla_forward(Ops& ops, const MlaWeights& w, const MlaDims& dims, const Tensor& x, const BatchView& batch,
                 KvLayer cache, MlaMode mode, Tensor out, const Tensor& rope_cos_sin = Tensor{});

// mla_forward's two ends, for a layer that picks the keys its attention reads (DSA,
// model/layers/dsa.h): the same projections and cache rows, the same gated output, so the
// dense and sparse layers cannot drift apart. Both allocate in the caller's scratch scope.
struct MlaQueries {
  Tensor q;         // [T, H*(nope+rope)] F32, rotated when rope_cos_sin is given
  Tensor q_latent;  // [T, q_lora_rank] act dtype: RMSNorm(q_a(x)), what q_b reads; empty without q LoRA
};
MlaQueries mla_queries_and_store(Ops& ops, const MlaWeights& w, const MlaDims& dims, const Tensor& x,
                                 const BatchView& batch, KvLayer cache, const Tensor& rope_cos_sin = Tensor{});
// o [T, H*v] F32 (the attention's output) -> out [T, hidden] F32: the gate, o_proj, the TP sum.
void mla_output(Ops& ops, const MlaWeights& w, const MlaDims& dims, const Tensor& x, const Tensor& o, Tensor out);

}  // namespace moonrun
