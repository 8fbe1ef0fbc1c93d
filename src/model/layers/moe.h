#pragma once
// The MoE block (K3_SPEC.md §2), written once against the ops: the router on the
// full-width x in fp32; the routed experts in the LatentMoE space (routed_expert_down_proj,
// the experts, RMSNorm and routed_expert_up_proj after the weighted sum); the shared
// experts are a dense MLP on x.
#include "backend/ops.h"
#include "model/layers/mlp.h"

namespace moonrun {

struct MoeDims {
  int hidden = 0;
  int io_dim = 0;  // the routed experts' width: routed_expert_hidden_size, or hidden when not latent
  RouterParams router;
  ActivationParams act;
  float norm_eps = 1e-5f;  // routed_expert_norm (rms_norm_eps)
  // Split over the tensor-parallel group (model/weight_spec.h, WeightLayout): this rank
  // holds the router's rows of experts [tp_rank * E / tp, ...) and, for the LatentMoE, the
  // down projection's rows and the up projection's columns [tp_rank * io / tp, ...).
  bool split_router = false;
  bool split_latent = false;     // the down projection's columns (its output all-gathered)
  bool split_latent_up = false;  // and the up projection's (else whole: the packed all-reduce)
  int tp_rank = 0;
  // DP attention: the shared experts are whole on every rank (no all-reduce after them).
  bool shared_whole = false;
};

struct MoeWeights {
  Matrix router;             // [num_experts, hidden] F32 (router logits in fp32)
  Tensor router_bias;        // [1, num_experts] F32 e_score_correction_bias (may be empty)
  ExpertMatrices w1, w3, w2;  // gate, up [inter, io]; down [io, inter]; MXFP4 or dense
  MlpWeights shared;          // intermediate moe_intermediate * num_shared; empty if none
  Matrix latent_down;         // [io, hidden]; empty when not latent
  Matrix latent_up;           // [hidden, io]
  Tensor latent_norm;         // [1, io] F32; empty when latent_moe_use_norm is false
};

// Its matrices but the routed experts (chosen per token) in the order a step reads them (a
// prefetch hint's list; issue #41): the router, the latent down projection, the shared
// experts, the latent up projection.
inline std::vector<Tensor> moe_weights_read_order(const MoeWeights& m) {
  return {m.router.w, m.latent_down.w, m.shared.gate.w, m.shared.up.w, m.shared.down.w, m.latent_up.w};
}

// x: the post_attention_layernorm'ed input [T, hidden] in F32 (the router's) and in the act
// dtype (the projections'; the same tensor when act is F32) -> out [T, hidden] F32.
void moe_forward(Ops& ops, const MoeWeights& w, const MoeDims& dims, const Tensor& x_f32, const Tensor& x_act,
                 Tensor out);

// DP attention (SGLang's --enable-dp-attention): each rank of the group ran attention for its
// own sequences, x_f32 [T, hidden] being its rows (T may be 0: a rank without sequences this
// step still takes part). The rows of every rank are gathered in rank order (dp_tokens[r]
// rows from rank r: zero rows elsewhere, summed over the group), the router and the
// expert-parallel experts run over all of them (their sum all-reduced as moe_forward does),
// and this rank keeps its own rows; its shared experts (whole here) run on its rows alone.
void moe_forward_dp(Ops& ops, const MoeWeights& w, const MoeDims& dims, const Tensor& x_f32, const Tensor& x_act,
                    const std::vector<int32_t>& dp_tokens, int dp_rank, Tensor out);

}  // namespace moonrun
