#pragma once
// The Kimi K2 generation (K2, K2-Thinking, K2.5 .. K2.7): the DeepSeek-V3 layout. Per layer
// input_layernorm -> MLA (q_a/q_b low rank, kv_a with the rope key, kv_b; rotary embeddings
// with YaRN scaling on the rope dims; no output gate) -> post_attention_layernorm -> dense MLP
// (layers < first_k_dense_replace) or MoE (sigmoid router with e_score_correction_bias,
// grouped top-k, routed experts INT4 pack-quantized, shared experts bf16). Plain residual
// stream, SwiGLU. Names as transformers' models/deepseek_v3 and vLLM's deepseek_v2.py load
// them; K2.5 and later put them under "language_model.".
//
// This step lists the weights (verify, plan); the forward is not built yet.
#include <vector>

#include "backend/tensor.h"
#include "model/layers/mla.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/weight_spec.h"

namespace moonrun {

struct KimiK2LayerWeights {
  Tensor input_layernorm;           // [1, hidden] F32
  Tensor post_attention_layernorm;  // [1, hidden] F32
  MlaWeights mla;
  MlpWeights mlp;  // dense layers
  MoeWeights moe;  // MoE layers
};

struct KimiK2Weights {
  Matrix embed_tokens;  // [vocab, hidden]
  std::vector<KimiK2LayerWeights> layers;
  Tensor norm;      // [1, hidden] F32
  Matrix lm_head;   // [vocab, hidden]
};

// The one listing of the K2 text model's tensors (names, stored shapes and dtypes, shard
// rules), filling `w` through `sink`. The shard rules are K3's for the same roles: q_a,
// kv_a and the router replicated; q_b, kv_b, gate/up column; o_proj, down row; routed
// experts whole per expert group; embeddings and lm_head by vocabulary rows.
void describe_kimi_k2_weights(const ModelConfig& cfg, KimiK2Weights& w, WeightSink& sink);

}  // namespace moonrun
