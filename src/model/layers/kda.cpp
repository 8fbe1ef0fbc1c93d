#include "model/layers/kda.h"

namespace moonrun {

namespace {
// Up to this many tokens (decode batches) a KDA layer projects q, k, v and its output gate in
// one linear_shared_input call; a longer prompt would need four [T, H*d] buffers at once.
constexpr int64_t kSharedProjectionMaxTokens = 256;
}  // namespace

int64_t kda_conv_window_floats(const KdaShape& shape) {
  return static_cast<int64_t>(shape.conv_kernel - 1) * shape.proj_dim();
}

int64_t kda_state_floats(const KdaShape& shape) {
  return kda_s_offset(shape) + static_cast<int64_t>(shape.num_heads) * shape.head_dim * shape.head_dim;
}

int64_t kda_replay_floats_per_token(const KdaShape& shape) {
  return 4 * static_cast<int64_t>(shape.proj_dim()) + shape.num_heads;
}

namespace {
// A layer's saved rows are five blocks of `capacity` rows: the q, k and v projections before
// the conv, g ([capacity, H*d] each), then beta ([capacity, H]).
Tensor saved_block(const KdaSavedInputs& s, const KdaShape& shape, int block, int64_t rows) {
  const int64_t D = shape.proj_dim();
  return Tensor{s.saved + block * s.capacity * D, DType::F32, rows, block == 4 ? shape.num_heads : D};
}
}  // namespace

void kda_forward(Ops& ops, const KdaWeights& w, const KdaShape& shape, const Tensor& x, const BatchView& batch,
                 StateLayer state, KdaMode mode, Tensor out, const KdaSavedInputs* save, bool reduce) {
  ScratchScope scope(ops);
  const int64_t T = x.rows, D = shape.proj_dim(), H = shape.num_heads, d = shape.head_dim;
  const int64_t window = kda_conv_window_floats(shape);
  auto part = [&](int64_t offset) { return StateLayer{state.base + offset, state.slot_stride_floats}; };
  // A decode-size batch projects q, k, v and K3's full-rank output gate in one call (below).
  const bool together = T <= kSharedProjectionMaxTokens && !w.g_proj.empty();
  // A verify step saving every row in order, with the projections in one buffer, keeps the
  // five inputs in one copy_many after beta (one launch a layer on CUDA); otherwise each is
  // kept as soon as it exists (a prompt-size step reuses one projection buffer).
  const bool save_at_end = save && save->rows.empty() && together;
  auto keep = [&](const Tensor& src, int block) {
    if (!save || save_at_end) return;
    if (save->rows.empty()) ops.copy(src, saved_block(*save, shape, block, src.rows));  // every row, in order
    else ops.gather_rows(src, save->rows.as<int32_t>(), saved_block(*save, shape, block, save->rows.rows));
  };

  // q, k, v: projection, then the short conv, each with its own window. A decode-size batch
  // projects q, k, v and K3's full-rank output gate in one call (four [H*d, hidden] matrices
  // over the same x, back to back as the loader places them, so a backend can stream them as
  // one GEMM); a prompt-size one, one at a time through one buffer.
  Tensor projs = ops.scratch(together ? 4 * T : T, D, DType::F32);
  auto proj = [&](int i) { return together ? projs.rows_view(i * T, T) : projs; };
  if (together) {
    const Matrix* ws[] = {&w.q_proj, &w.k_proj, &w.v_proj, &w.g_proj};
    const Tensor ys[] = {proj(0), proj(1), proj(2), proj(3)};
    ops.linear_shared_input(x, ws, ys);
    for (int i = 0; i < 3; ++i) keep(proj(i), i);
  }
  Tensor q = ops.scratch(T, D, DType::F32);  // [T, H*d]
  Tensor k = ops.scratch(T, D, DType::F32);
  Tensor v = ops.scratch(T, D, DType::F32);
  if (!together) {
    ops.linear(x, w.q_proj, proj(0));
    keep(proj(0), 0);
  }
  ops.short_conv(proj(0), w.q_conv, batch, part(0), /*silu=*/true, q);
  if (!together) {
    ops.linear(x, w.k_proj, proj(1));
    keep(proj(1), 1);
  }
  ops.short_conv(proj(1), w.k_conv, batch, part(window), true, k);
  if (!together) {
    ops.linear(x, w.v_proj, proj(2));
    keep(proj(2), 2);
  }
  ops.short_conv(proj(2), w.v_conv, batch, part(2 * window), true, v);

  // L2 norm per head (the reference does it inside the kernel), q scaled by d^-1/2.
  ops.l2norm_rows(q.reshaped(d), 1.0f / std::sqrt(static_cast<float>(d)));
  ops.l2norm_rows(k.reshaped(d), 1.0f);

  // The decay gate, in fp32 from raw = f_b(f_a(x)) + dt_bias (f_a's output is a projection input).
  Tensor low = ops.scratch(T, w.f_a_proj.out, ops.act_dtype());
  Tensor g = ops.scratch(T, D, DType::F32);  // [T, H*d]
  ops.linear(x, w.f_a_proj, low);
  ops.linear(low, w.f_b_proj, g);
  ops.kda_gate(g, w.A_log, w.dt_bias, static_cast<int>(d), shape.gate_lower_bound);
  keep(g, 3);
  Tensor beta = ops.scratch(T, H, DType::F32);  // [T, H]
  ops.linear(x, w.b_proj, beta);
  ops.sigmoid(beta);
  keep(beta, 4);
  if (save_at_end) {
    const Tensor src[] = {proj(0), proj(1), proj(2), g, beta};
    Tensor dst[5];
    for (int b = 0; b < 5; ++b) dst[b] = saved_block(*save, shape, b, T);
    ops.copy_many(src, dst);
  }

  Tensor o = ops.scratch(T, D, DType::F32);  // [T, H*d]
  ops.kda_recurrence(q, k, v, g, beta, batch, part(kda_s_offset(shape)), static_cast<int>(H), static_cast<int>(d),
                     mode, o);

  // Output gate: full rank in K3 (already projected when `together`), low rank in Kimi
  // Linear (into the projection buffer).
  Tensor gate = proj(3);
  if (!together && !w.g_proj.empty()) {
    ops.linear(x, w.g_proj, gate);
  } else if (!together) {
    Tensor glow = ops.scratch(T, w.g_a_proj.out, ops.act_dtype());
    ops.linear(x, w.g_a_proj, glow);
    ops.linear(glow, w.g_b_proj, gate);
  }
  Tensor gated = ops.scratch(T, D, ops.act_dtype());  // the o_proj input
  ops.gated_rmsnorm(o.reshaped(d), gate.reshaped(d), w.o_norm, shape.norm_eps, gated.reshaped(d));
  ops.linear(gated, w.o_proj, out);
  if (reduce) ops.all_reduce_sum(out);  // o_proj is row-parallel: each rank's heads contribute
}

void kda_replay(Ops& ops, const KdaWeights& w, const KdaShape& shape, const BatchView& batch, StateLayer state,
                KdaMode mode, const KdaSavedInputs& from) {
  ScratchScope scope(ops);
  const int64_t T = batch.n_tokens(), D = shape.proj_dim(), H = shape.num_heads, d = shape.head_dim;
  const int64_t window = kda_conv_window_floats(shape);
  auto part = [&](int64_t offset) { return StateLayer{state.base + offset, state.slot_stride_floats}; };
  // The same ops on the same rows as kda_forward (Ops::kda_replay_inputs): the windows and
  // S end bit for bit where a forward over these tokens alone would leave them.
  Ops::KdaReplayInputs r;
  for (int b = 0; b < 5; ++b) r.saved[b] = saved_block(from, shape, b, from.capacity);
  r.rows = from.rows;
  r.conv[0] = w.q_conv, r.conv[1] = w.k_conv, r.conv[2] = w.v_conv;
  for (int i = 0; i < 3; ++i) r.window[i] = part(i * window);
  r.head_dim = static_cast<int>(d);
  r.q_scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int b = 0; b < 4; ++b) r.out[b] = ops.scratch(T, D, DType::F32);
  r.out[4] = ops.scratch(T, H, DType::F32);
  ops.kda_replay_inputs(r, batch);
  const Tensor &q = r.out[0], &k = r.out[1], &v = r.out[2], &g = r.out[3], &beta = r.out[4];
  Tensor o = ops.scratch(T, D, DType::F32);  // not needed: the step's outputs were the verify's
  ops.kda_recurrence(q, k, v, g, beta, batch, part(kda_s_offset(shape)), static_cast<int>(H), static_cast<int>(d),
                     mode, o);
}

}  // namespace moonrun
