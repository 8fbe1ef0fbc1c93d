#include "model/layers/moe.h"

namespace moonrun {

void moe_forward(Ops& ops, const MoeWeights& w, const MoeDims& dims, const Tensor& x_f32, const Tensor& x_act,
                 Tensor out) {
  ScratchScope scope(ops);
  const int64_t T = x_f32.rows, E = dims.router.num_experts, K = dims.router.top_k, D = dims.io_dim;

  // Routing from the full-width x, in fp32 (split: each rank's experts' logits, gathered).
  Tensor logits = ops.scratch(T, E, DType::F32);
  if (dims.split_router) {
    Tensor part = ops.scratch(T, w.router.out, DType::F32);  // [T, E / tp]
    ops.linear(x_f32, w.router, part);
    ops.all_gather_cols(part, logits);
  } else {
    ops.linear(x_f32, w.router, logits);
  }
  Tensor ids = ops.scratch(T, K, DType::I32);
  Tensor weights = ops.scratch(T, K, DType::F32);
  ops.router_topk(logits, w.router_bias, dims.router, ids, weights);

  // Into the latent space, through the experts, back to full width.
  Tensor z = x_act;  // [T, io]
  if (!w.latent_down.empty()) {
    z = ops.scratch(T, D, ops.act_dtype());
    if (dims.split_latent) {  // this rank's latent columns, gathered (in fp32, as collectives are)
      Tensor part = ops.scratch(T, w.latent_down.out, DType::F32);  // [T, io / tp]
      ops.linear(x_act, w.latent_down, part);
      Tensor full = z.dtype == DType::F32 ? z : ops.scratch(T, D, DType::F32);
      ops.all_gather_cols(part, full);
      if (full.data != z.data) ops.copy(full, z);
    } else {
      ops.linear(x_act, w.latent_down, z);
    }
  }
  Tensor y = ops.scratch(T, D, DType::F32);  // [T, io] the weighted sum of the chosen experts
  ops.moe_experts(z, ids, weights, w.w1, w.w3, w.w2, dims.act, y);
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
  // Split: the up projection is row-parallel, so out is this rank's partial sum, reduced
  // below together with the shared experts' (one all-reduce for both).
  bool partial = false;
  if (!w.latent_up.empty()) {
    Tensor y_in = ops.act_dtype() == DType::F32 ? y : ops.scratch(T, D, ops.act_dtype());
    if (!w.latent_norm.empty()) ops.rmsnorm(y, w.latent_norm, dims.norm_eps, y_in);
    else if (y_in.data != y.data) ops.copy(y, y_in);
    if (dims.split_latent) {
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
    Tensor shared = ops.scratch(T, dims.hidden, DType::F32);
    mlp_forward(ops, w.shared, dims.act, x_act, shared, /*reduce=*/!partial && !dims.shared_whole);
    ops.add(out, shared, out);
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
