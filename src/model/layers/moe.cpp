#include "model/layers/moe.h"

namespace moonrun {

void moe_forward(Ops& ops, const MoeWeights& w, const MoeDims& dims, const Tensor& x_f32, const Tensor& x_act,
                 Tensor out) {
  ScratchScope scope(ops);
  const int64_t T = x_f32.rows, E = dims.router.num_experts, K = dims.router.top_k, D = dims.io_dim;

  // Routing from the full-width x, in fp32 (split: each rank's experts' logits, gathered),
  // and the way into the latent space (split: this rank's latent columns, gathered in fp32,
  // as collectives are). Both split: the two parts side by side in one buffer, one gather.
  Tensor logits = ops.scratch(T, E, DType::F32);
  const bool latent = !w.latent_down.empty(), split_latent = latent && dims.split_latent;
  Tensor z = latent ? ops.scratch(T, D, ops.act_dtype()) : x_act;  // [T, io]
  Tensor z_full = split_latent && z.dtype != DType::F32 ? ops.scratch(T, D, DType::F32) : z;
  Tensor router_part, latent_part;  // [T, E / tp], [T, io / tp]
  if (dims.split_router && split_latent) {
    Tensor parts = ops.scratch(1, T * (w.router.out + w.latent_down.out), DType::F32);
    router_part = Tensor{parts.data, DType::F32, T, w.router.out};
    latent_part = Tensor{parts.as<float>() + T * w.router.out, DType::F32, T, w.latent_down.out};
  } else {
    if (dims.split_router) router_part = ops.scratch(T, w.router.out, DType::F32);
    if (split_latent) latent_part = ops.scratch(T, w.latent_down.out, DType::F32);
  }
  ops.linear(x_f32, w.router, dims.split_router ? router_part : logits);
  if (latent) ops.linear(x_act, w.latent_down, split_latent ? latent_part : z);
  if (dims.split_router && split_latent) {
    const Tensor parts[] = {router_part, latent_part};
    Tensor outs[] = {logits, z_full};
    ops.all_gather_cols_packed(parts, outs);
  } else if (dims.split_router) {
    ops.all_gather_cols(router_part, logits);
  } else if (split_latent) {
    ops.all_gather_cols(latent_part, z_full);
  }
  if (z_full.data != z.data) ops.copy(z_full, z);
  Tensor ids = ops.scratch(T, K, DType::I32);
  Tensor weights = ops.scratch(T, K, DType::F32);
  ops.router_topk(logits, w.router_bias, dims.router, ids, weights);

  // Through the experts, back to full width.
  // LatentMoE with the up projection whole on every rank (replicated, or only the down
  // projection split) and shared experts split over the group: the routed sum (needed whole
  // before the latent norm, which is not linear) and the shared experts' partial sum are
  // all-reduced as one buffer, [T x io | T x hidden] fp32: one collective a MoE layer instead
  // of two, the same sums element by element. At one rank there is nothing to reduce: the
  // ops keep the order the single-GPU figures were measured with.
  const bool packed = !w.latent_up.empty() && !dims.split_latent_up && !w.shared.empty() && !dims.shared_whole &&
                      ops.parallel_size() > 1;
  Tensor both, y, shared;
  if (packed) {
    both = ops.scratch(1, T * (D + dims.hidden), DType::F32);
    y = Tensor{both.data, DType::F32, T, D};
    shared = Tensor{both.as<float>() + T * D, DType::F32, T, dims.hidden};
  } else {
    y = ops.scratch(T, D, DType::F32);  // [T, io] the weighted sum of the chosen experts
  }
  ops.moe_experts(z, ids, weights, w.w1, w.w3, w.w2, dims.act, y);
  if (packed) {
    mlp_forward(ops, w.shared, dims.act, x_act, shared, /*reduce=*/false);
    ops.all_reduce_sum(both);
    Tensor y_in = ops.act_dtype() == DType::F32 ? y : ops.scratch(T, D, ops.act_dtype());
    if (!w.latent_norm.empty()) ops.rmsnorm(y, w.latent_norm, dims.norm_eps, y_in);
    else if (y_in.data != y.data) ops.copy(y, y_in);
    ops.linear(y_in, w.latent_up, out);
    ops.add(out, shared, out);
    return;
  }
  // Without a LatentMoE (K2, Kimi Linear) nothing stands between the routed sum and the
  // shared experts' output: both are partial sums over the group (this rank's experts, its
  // slice of the shared intermediate), added here and all-reduced once (one collective a
  // MoE layer instead of two). At one rank the same adds in the same order.
  if (w.latent_up.empty() && !w.shared.empty() && !dims.shared_whole) {
    ops.copy(y, out);
    Tensor shared = ops.scratch(T, dims.hidden, DType::F32);
    mlp_forward(ops, w.shared, dims.act, x_act, shared, /*reduce=*/false);
    ops.add(out, shared, out);
    ops.all_reduce_sum(out);
    return;
  }
  // Each rank ran its experts (and its slice of each): the sum over the group is the
  // routed output, before the latent norm (not linear) and up-projection (replicated).
  ops.all_reduce_sum(y);
  // Split up projection: row-parallel, so out is this rank's partial sum, reduced below
  // together with the shared experts' (one all-reduce for both).
  bool partial = false;
  if (!w.latent_up.empty()) {
    Tensor y_in = ops.act_dtype() == DType::F32 ? y : ops.scratch(T, D, ops.act_dtype());
    if (!w.latent_norm.empty()) ops.rmsnorm(y, w.latent_norm, dims.norm_eps, y_in);
    else if (y_in.data != y.data) ops.copy(y, y_in);
    if (dims.split_latent_up) {
      const int64_t cols = w.latent_up.in;  // io / tp
      Tensor mine = ops.scratch(T, cols, y_in.dtype);
      ops.copy_cols(y_in, dims.tp_rank * cols, mine, 0, cols);
      ops.linear(mine, w.latent_up, out);
      partial = true;
    } else {
      ops.linear(y_in, w.latent_up, out);
    }
  } else {
    ops.copy(y, out);
  }
  if (!w.shared.empty()) {
    Tensor shared_out = ops.scratch(T, dims.hidden, DType::F32);
    mlp_forward(ops, w.shared, dims.act, x_act, shared_out, /*reduce=*/!partial && !dims.shared_whole);
    ops.add(out, shared_out, out);
  }
  if (partial) ops.all_reduce_sum(out);
}

void moe_forward_dp(Ops& ops, const MoeWeights& w, const MoeDims& dims, const Tensor& x_f32, const Tensor& x_act,
                    const std::vector<int32_t>& dp_tokens, int dp_rank, Tensor out) {
  ScratchScope scope(ops);
  const int64_t T = x_f32.rows, H = x_f32.cols;
  int64_t all = 0, first = 0;
  for (size_t r = 0; r < dp_tokens.size(); ++r) {
    if (static_cast<int>(r) == dp_rank) first = all;
    all += dp_tokens[r];
  }
  MR_CHECK(dp_rank >= 0 && dp_rank < static_cast<int>(dp_tokens.size()) && dp_tokens[dp_rank] == T)
      << "DP rank " << dp_rank << " brings " << T << " rows";
  if (all == 0) return;
  // The gather as a sum: each rank's rows in its place, zeros elsewhere (x + 0 is exact).
  Tensor xs = ops.scratch(all, H, DType::F32);
  ops.zero(xs);
  if (T > 0) ops.copy(x_f32, xs.rows_view(first, T));
  ops.all_reduce_sum(xs);
  Tensor xa = xs;
  if (ops.act_dtype() != DType::F32) {
    xa = ops.scratch(all, H, ops.act_dtype());
    ops.copy(xs, xa);
  }
  // The routed experts only (moe_forward without shared experts), over every rank's rows.
  MoeWeights routed = w;
  routed.shared = MlpWeights{};
  Tensor ys = ops.scratch(all, H, DType::F32);
  moe_forward(ops, routed, dims, xs, xa, ys);
  if (T == 0) return;
  ops.copy(ys.rows_view(first, T), out);
  if (!w.shared.empty()) {
    Tensor shared = ops.scratch(T, H, DType::F32);
    mlp_forward(ops, w.shared, dims.act, x_act, shared, /*reduce=*/false);
    ops.add(out, shared, out);
  }
}

}  // namespace moonrun
