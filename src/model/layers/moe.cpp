#include "model/layers/moe.h"

namespace moonrun {

void moe_forward(Ops& ops, const MoeWeights& w, const MoeDims& dims, const Tensor& x_f32, const Tensor& x_act,
                 Tensor out) {
  ScratchScope scope(ops);
  const int64_t T = x_f32.rows, E = dims.router.num_experts, K = dims.router.top_k, D = dims.io_dim;

  // Routing from the full-width x, in fp32.
  Tensor logits = ops.scratch(T, E, DType::F32);
  ops.linear(x_f32, w.router, logits);
  Tensor ids = ops.scratch(T, K, DType::I32);
  Tensor weights = ops.scratch(T, K, DType::F32);
  ops.router_topk(logits, w.router_bias, dims.router, ids, weights);

  // Into the latent space, through the experts, back to full width.
  Tensor z = x_act;  // [T, io]
  if (!w.latent_down.empty()) {
    z = ops.scratch(T, D, ops.act_dtype());
    ops.linear(x_act, w.latent_down, z);
  }
  Tensor y = ops.scratch(T, D, DType::F32);  // [T, io] the weighted sum of the chosen experts
  ops.moe_experts(z, ids, weights, w.w1, w.w3, w.w2, dims.act, y);
  // Each rank ran its experts (and its slice of each): the sum over the group is the
  // routed output, before the latent norm (not linear) and up-projection (replicated).
  ops.all_reduce_sum(y);
  if (!w.latent_up.empty()) {
    Tensor y_in = ops.act_dtype() == DType::F32 ? y : ops.scratch(T, D, ops.act_dtype());
    if (!w.latent_norm.empty()) ops.rmsnorm(y, w.latent_norm, dims.norm_eps, y_in);
    else if (y_in.data != y.data) ops.copy(y, y_in);
    ops.linear(y_in, w.latent_up, out);
  } else {
    ops.copy(y, out);
  }
  if (!w.shared.empty()) {
    Tensor shared = ops.scratch(T, dims.hidden, DType::F32);
    mlp_forward(ops, w.shared, dims.act, x_act, shared);
    ops.add(out, shared, out);
  }
}

}  // namespace moonrun
