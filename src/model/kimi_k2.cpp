#include "model/kimi_k2.h"

#include <algorithm>

#include "common/check.h"
#include "model/layer_dims.h"

namespace moonrun {

void describe_kimi_k2_weights(const ModelConfig& cfg, KimiK2Weights& w, WeightSink& sink, const WeightLayout& layout) {
  const StageLayers& stage = layout.stage;
  const TensorNames names(cfg);
  const int H = cfg.hidden_size, nh = cfg.num_attention_heads;
  auto vec = [&](Tensor& dst, const std::string& name, int64_t n, DType stored = DType::BF16) {
    sink.f32(dst, name, stored, {n}, 1, n, ShardRule::replicated);
  };
  auto mlp = [&](MlpWeights& m, int i, const std::string& prefix, int inter) {
    sink.matrix(m.gate, names.layer(i, prefix + "gate_proj.weight"), inter, H, ShardRule::column);
    sink.matrix(m.up, names.layer(i, prefix + "up_proj.weight"), inter, H, ShardRule::column);
    sink.matrix(m.down, names.layer(i, prefix + "down_proj.weight"), H, inter, ShardRule::row);
  };

  if (stage.first()) sink.matrix(w.embed_tokens, names.global("embed_tokens.weight"), cfg.vocab_size, H, ShardRule::vocab);
  w.layers.resize(cfg.num_hidden_layers);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    if (!stage.has(i)) continue;
    KimiK2LayerWeights& lw = w.layers[i];
    vec(lw.input_layernorm, names.layer(i, "input_layernorm.weight"), H);
    vec(lw.post_attention_layernorm, names.layer(i, "post_attention_layernorm.weight"), H);

    // MLA (DeepseekV3Attention): q through the q_a/q_b low rank (q_proj when q_lora_rank is
    // null), kv_a_proj_with_mqa giving the latent and the shared rope key, no output gate.
    MlaWeights& a = lw.mla;
    auto attn = [&](const std::string& s) { return names.layer(i, "self_attn." + s); };
    const int qhd = cfg.mla_q_head_dim();
    if (cfg.q_lora_rank > 0) {
      sink.matrix(a.q_a_proj, attn("q_a_proj.weight"), cfg.q_lora_rank, H, ShardRule::replicated);
      vec(a.q_a_layernorm, attn("q_a_layernorm.weight"), cfg.q_lora_rank);
      sink.matrix(a.q_b_proj, attn("q_b_proj.weight"), nh * qhd, cfg.q_lora_rank, ShardRule::column);
    } else {
      sink.matrix(a.q_proj, attn("q_proj.weight"), nh * qhd, H, ShardRule::column);
    }
    sink.matrix(a.kv_a_proj_with_mqa, attn("kv_a_proj_with_mqa.weight"), cfg.mla_cache_row(), H,
                ShardRule::replicated);
    vec(a.kv_a_layernorm, attn("kv_a_layernorm.weight"), cfg.kv_lora_rank);
    sink.matrix(a.kv_b_proj, attn("kv_b_proj.weight"), nh * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                cfg.kv_lora_rank, ShardRule::column);
    sink.matrix(a.o_proj, attn("o_proj.weight"), H, nh * cfg.v_head_dim, ShardRule::row);

    if (cfg.layers[i].mlp == MlpKind::dense) {
      mlp(lw.mlp, i, "mlp.", cfg.intermediate_size);
      continue;
    }
    // DeepseekV3MoE: the router (DeepseekV3TopkRouter: weight [E, H] and the fp32
    // e_score_correction_bias [E]), the routed experts, the shared experts.
    MoeWeights& m = lw.moe;
    const int E = cfg.num_experts, I = cfg.moe_intermediate_size;
    sink.f32(m.router.w, names.layer(i, "mlp.gate.weight"), DType::BF16, {E, H}, E, H,
             layout.split_router ? ShardRule::column : ShardRule::replicated);
    m.router.out = static_cast<int>(m.router.w.rows);  // this rank's experts' rows when split
    m.router.in = H;
    vec(m.router_bias, names.layer(i, "mlp.gate.e_score_correction_bias"), E, DType::F32);
    sink.experts(m.w1, i, ExpertMatrix::w1, E, I, H);
    sink.experts(m.w2, i, ExpertMatrix::w2, E, H, I);
    sink.experts(m.w3, i, ExpertMatrix::w3, E, I, H);
    if (cfg.num_shared_experts > 0) mlp(m.shared, i, "mlp.shared_experts.", cfg.shared_intermediate_size());
  }
  if (!stage.first()) return;  // norm and lm_head: the first stage's (model/pipeline.h: the ring)
  vec(w.norm, names.global("norm.weight"), H);
  if (cfg.tie_word_embeddings) w.lm_head = w.embed_tokens;
  else sink.matrix(w.lm_head, cfg.lm_head_name, cfg.vocab_size, H, ShardRule::vocab);
  describe_moonvit_weights(cfg, w.vision, sink);  // nothing without a tower
}

}  // namespace moonrun

// ---- the model ---------------------------------------------------------------------------

namespace moonrun {

namespace {

// The MLA dims for this rank's heads; moe and activations as layer_dims.h derives them
// (SwiGLU: the config's silu).
MlaDims k2_mla_dims(const ModelConfig& c, int tp_size) {
  MlaDims d = mla_dims(c);
  d.attn.num_heads /= tp_size;
  return d;
}

}  // namespace

KimiK2::KimiK2(Ops& ops, const ModelConfig& cfg, KimiK2Weights weights, size_t weight_bytes, TensorParallel tp,
               int64_t max_positions, StageLayers stage)
    : cfg_(cfg),
      w_(std::move(weights)),
      weight_bytes_(weight_bytes),
      tp_(tp),
      stage_(stage),
      vocab_begin_(tp.dp_attention ? 0 : static_cast<int64_t>(cfg.vocab_size) / tp.size * tp.rank),
      mla_dims_(k2_mla_dims(cfg, tp.size)),
      moe_dims_(moe_dims(cfg)),
      act_(activation_params(cfg)),
      rope_(cfg.qk_rope_head_dim, cfg.k2.rope_theta, cfg.k2.rope_scaling),
      vision_(cfg, std::move(w_.vision)) {
  moe_dims_.split_router = tp.split_router;
  moe_dims_.tp_rank = tp.rank;
  moe_dims_.shared_whole = tp.dp_attention;
  mla_dims_.reduce_output = !tp.dp_attention;
  stage_.first_layer = std::clamp(stage_.first_layer, 0, cfg.num_hidden_layers);
  stage_.end_layer = std::clamp(stage_.end_layer, stage_.first_layer, cfg.num_hidden_layers);
  for (int i = 0; i < stage_.first_layer; ++i) mla_base_ += cfg.layers[i].attn != LayerKind::kda;
  // YaRN widens the softmax scale (nope + rope)^-1/2 by mscale(factor, mscale_all_dim)^2.
  // mla_attention keeps the plain scale; q is linear in q_a_layernorm's weight (q = q_b(w *
  // rmsnorm(q_a x))) or in q_proj, so the factor goes into that weight, exactly in F32 for
  // the norm weight (every backend holds it in F32).
  // The rope rows of every position a sequence may reach, gathered per step on the device
  // (a captured decode graph replays at any position).
  const int64_t n_positions = max_positions > 0                ? max_positions
                              : cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings
                                                                : 4096;
  rope_rows_ = alloc_rope_rows(ops, rope_, n_positions, "K2 rope rows");
  const float f = rope_.softmax_scale_factor();
  if (f != 1.0f) {
    for (int i = stage_.first_layer; i < stage_.end_layer; ++i) {
      KimiK2LayerWeights& lw = w_.layers[static_cast<size_t>(i)];
      if (cfg_.q_lora_rank > 0) {
        fold_softmax_factor(ops, lw.mla.q_a_layernorm, f);
      } else {
        MR_CHECK(lw.mla.q_proj.w.dtype == DType::F32) << "YaRN's softmax factor without q_lora needs F32 q_proj";
        fold_softmax_factor(ops, lw.mla.q_proj.w, f);
      }
    }
    ops.synchronize();
  }
}

CacheSpec KimiK2::cache_spec_of_layers(int first_layer, int end_layer) const {
  CacheSpec spec;
  // Every K2 layer is MLA: the stage's count.
  spec.kv_layers = std::max(std::min(end_layer, cfg_.num_hidden_layers) - std::max(first_layer, 0), 0);
  spec.kv_row_width = cfg_.mla_cache_row();
  return spec;
}

int64_t KimiK2::scratch_bytes(int tokens_per_step) const {
  // As KimiK3::scratch_bytes, without KDA and AttnRes: per new token the logits row, the
  // residual stream, the widest layer's activations, the rope rows; plus plain-mode MLA's
  // expansion of one block of keys.
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size;
  const int64_t stream = 8 * H * 4;
  const int64_t experts = static_cast<int64_t>(std::max(c.num_experts_per_token, 1)) *
                          (4 * std::max(c.moe_intermediate_size, 1) + 2 * c.expert_io_dim()) * 4 +
                          static_cast<int64_t>(c.num_experts) * 4 * 2;
  const int64_t dense = 4 * static_cast<int64_t>(std::max(c.intermediate_size, c.shared_intermediate_size())) * 4;
  const int64_t mla_q = 4 * static_cast<int64_t>(c.num_attention_heads) * (c.mla_q_head_dim() + c.v_head_dim) * 4 +
                        2 * static_cast<int64_t>(c.mla_cache_row()) * 4;
  const int64_t per_token = static_cast<int64_t>(c.vocab_size) * 4 + stream + std::max({experts + dense, mla_q}) +
                            2 * H * 4 + c.qk_rope_head_dim * 4;
  const int64_t heads = c.num_attention_heads, dqk = c.mla_q_head_dim(), dv = c.v_head_dim;
  const int64_t kv = heads * (c.qk_nope_head_dim + dv), lora = c.kv_lora_rank, pe = c.qk_rope_head_dim;
  const int64_t per_key = std::max(2 * (lora + pe + kv) + 2 * heads * (dqk + dv), 4 * (lora + kv));
  const int64_t per_query = 2 * heads * dqk + 4 * heads * (dv + 2) + 8 * heads;
  const int64_t keys = mla_prefill_key_block(std::max(tokens_per_step, 1)) + 128;
  const int64_t mla_blocks = keys * per_key + (std::max(tokens_per_step, 1) + 128) * per_query + (int64_t{1} << 20);
  const int64_t text = per_token * std::max(tokens_per_step, 1) + mla_blocks + (int64_t{256} << 20);
  // The tower runs between steps in the same scratch: the larger of the two.
  return std::max(text, vision_.scratch_bytes(max_image_patches(tokens_per_step)));
}

void KimiK2::forward(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor logits) {
  ScratchScope scope(ops);
  if (tp_.dp_attention && batch.n_tokens() == 0)
    return dp_attention_idle_step(ops, cfg_, stage_, w_.layers, moe_dims_, *batch.host);
  forward_in_parts(ops, batch, pools, logits);
}

void KimiK2::forward_body(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor rows) {
  ScratchScope scope(ops);
  const int64_t T = batch.n_tokens(), H = cfg_.hidden_size;
  const float eps = cfg_.rms_norm_eps;
  const DType act = ops.act_dtype();
  const ForwardBatch& host = *batch.host;

  auto kv_of = [&](const LayerSpec& spec) {
    const int64_t layer_rows = static_cast<int64_t>(pools.num_pages) * pools.page_size_tokens;
    return KvLayer{pools.kv.rows_view((spec.mla_index - mla_base_) * layer_rows, layer_rows).data, pools.kv.dtype,
                   pools.page_size_tokens, static_cast<int>(pools.kv.cols)};
  };

  // The step's rotary rows, one per token at its position (shared by every layer). The
  // runner keeps positions inside the table (max_positions()).
  Tensor cos_sin = ops.scratch(T, cfg_.qk_rope_head_dim, DType::F32);
  for (int32_t p : host.positions)
    MR_CHECK(p >= 0 && p < rope_rows_.rows) << "position " << p << " outside the rope table of " << rope_rows_.rows;
  ops.gather_rows(rope_rows_, batch.positions, cos_sin);

  Tensor h = ops.scratch(T, H, DType::F32);  // the residual stream
  if (stage_.first()) {
    ops.embedding(w_.embed_tokens.w, vocab_begin_, batch, h);
    // Each rank looked up the ids of its vocabulary rows (under DP attention: all of them).
    if (!tp_.dp_attention) ops.all_reduce_sum(h);
  } else {
    ops.pipe_recv(h);  // the previous stage's residual stream
  }
  if (stage_.first()) put_given_rows(ops, host, h);  // an image's rows at its placeholders

  Tensor a = ops.scratch(T, H, DType::F32);   // a sub-layer's output
  Tensor xn = ops.scratch(T, H, DType::F32);  // normed, F32 (the router's input)
  Tensor xa = act == DType::F32 ? xn : ops.scratch(T, H, act);  // normed, the projections' input

  // Before each collective, what the forward reads after it, for a backend that may pull it
  // into L2 while the collective waits (Ops::prefetch_during_next_collective; issue #41).
  const bool prefetch = ops.parallel_size() > 1 && !tp_.dp_attention;
  for (int i = stage_.first_layer; i < stage_.end_layer; ++i) {
    const LayerSpec& spec = cfg_.layers[i];
    const KimiK2LayerWeights& lw = w_.layers[i];
    if (prefetch)
      ops.prefetch_during_next_collective(spec.mlp == MlpKind::dense ? mlp_weights_read_order(lw.mlp)
                                                                     : moe_weights_read_order(lw.moe));
    ops.rmsnorm(h, lw.input_layernorm, eps, xa);
    mla_forward(ops, lw.mla, mla_dims_, xa, batch, kv_of(spec), mla_mode_, a, cos_sin);
    ops.add(h, a, h);
    if (prefetch && i + 1 < stage_.end_layer)
      ops.prefetch_during_next_collective(mla_weights_read_order(w_.layers[i + 1].mla));
    if (spec.mlp == MlpKind::dense) {
      ops.rmsnorm(h, lw.post_attention_layernorm, eps, xa);
      mlp_forward(ops, lw.mlp, act_, xa, a, /*reduce=*/!tp_.dp_attention);
    } else {
      ops.rmsnorm(h, lw.post_attention_layernorm, eps, xn);
      if (xa.data != xn.data) ops.copy(xn, xa);
      if (tp_.dp_attention) moe_forward_dp(ops, lw.moe, moe_dims_, xn, xa, host.dp_tokens, host.dp_rank, a);
      else moe_forward(ops, lw.moe, moe_dims_, xn, xa, a);
    }
    ops.add(h, a, h);
  }
  MR_CHECK(rows.rows == batch.n_logit_rows() && rows.cols == H) << "forward_body: rows " << rows.rows << " x " << rows.cols;
  if (!stage_.last()) ops.pipe_send(h);  // the next stage goes on from here
  else ops.gather_rows(h, batch.logit_rows, rows);
}

void KimiK2::forward_head(Ops& ops, Tensor rows, Tensor logits) {
  ScratchScope scope(ops);
  if (!logit_rows_round_the_ring(ops, stage_, rows)) return;
  const int64_t R = rows.rows, H = cfg_.hidden_size;
  const float eps = cfg_.rms_norm_eps;
  const DType act = ops.act_dtype();

  // Final norm, lm_head.
  Tensor normed = act == DType::F32 ? rows : ops.scratch(R, H, act);
  ops.rmsnorm(rows, w_.norm, eps, normed);
  if (tp_.size == 1) {
    ops.linear(normed, w_.lm_head, logits);
  } else {
    Tensor local = ops.scratch(R, w_.lm_head.out, DType::F32);
    ops.linear(normed, w_.lm_head, local);
    ops.all_gather_cols(local, logits);
  }
}

}  // namespace moonrun
