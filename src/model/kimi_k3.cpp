#include "model/kimi_k3.h"

#include <algorithm>

#include "backend/dsa_index_row.h"
#include "model/layer_dims.h"

namespace moonrun {

// ---- the weights, listed once -----------------------------------------------------------

namespace {

struct Lister {
  const ModelConfig& cfg;
  WeightSink& sink;
  TensorNames names;
  WeightLayout layout;

  // A [1, n] vector the backends hold in F32 (stored bf16 unless `stored` says otherwise).
  void vec(Tensor& dst, const std::string& name, int64_t n, DType stored = DType::BF16,
           ShardRule rule = ShardRule::replicated) {
    sink.f32(dst, name, stored, {n}, 1, n, rule);
  }
  void mat(Matrix& dst, const std::string& name, int64_t out, int64_t in, ShardRule rule) {
    sink.matrix(dst, name, static_cast<int>(out), static_cast<int>(in), rule);
  }

  void kda(int i, KdaWeights& w) {
    const int64_t H = cfg.hidden_size, d = cfg.kda_head_dim, nh = cfg.kda_num_heads, P = cfg.kda_proj_dim();
    const int64_t K = cfg.kda_conv_kernel;
    auto n = [&](const std::string& s) { return names.layer(i, "self_attn." + s); };
    mat(w.q_proj, n("q_proj.weight"), P, H, ShardRule::column);
    mat(w.k_proj, n("k_proj.weight"), P, H, ShardRule::column);
    mat(w.v_proj, n("v_proj.weight"), P, H, ShardRule::column);
    // The full-rank output gate right after q, k, v: the four back to back in memory, so a
    // decode step projects them in one call (Ops::linear_shared_input).
    if (cfg.kda_full_rank_gate) mat(w.g_proj, n("g_proj.weight"), P, H, ShardRule::column);
    sink.f32(w.q_conv, n("q_conv1d.weight"), DType::F32, {P, 1, K}, P, K, ShardRule::column);
    sink.f32(w.k_conv, n("k_conv1d.weight"), DType::F32, {P, 1, K}, P, K, ShardRule::column);
    sink.f32(w.v_conv, n("v_conv1d.weight"), DType::F32, {P, 1, K}, P, K, ShardRule::column);
    // K3 stores A_log as [H]; Kimi Linear as [1, 1, H, 1] (is_alternative_shape accepts both).
    const std::vector<int64_t> a_log_shape =
        cfg.model_type == "kimi_linear" ? std::vector<int64_t>{1, 1, nh, 1} : std::vector<int64_t>{nh};
    sink.f32(w.A_log, n("A_log"), DType::F32, a_log_shape, 1, nh, ShardRule::column);
    vec(w.dt_bias, n("dt_bias"), P, DType::F32, ShardRule::column);
    mat(w.f_a_proj, n("f_a_proj.weight"), d, H, ShardRule::replicated);
    mat(w.f_b_proj, n("f_b_proj.weight"), P, d, ShardRule::column);
    mat(w.b_proj, n("b_proj.weight"), nh, H, ShardRule::column);
    if (!cfg.kda_full_rank_gate) {
      mat(w.g_a_proj, n("g_a_proj.weight"), d, H, ShardRule::replicated);
      mat(w.g_b_proj, n("g_b_proj.weight"), P, d, ShardRule::column);
    }
    vec(w.o_norm, n("o_norm.weight"), d, DType::F32);
    mat(w.o_proj, n("o_proj.weight"), H, P, ShardRule::row);
  }

  void mla(int i, MlaWeights& w) {
    const int64_t H = cfg.hidden_size, nh = cfg.num_attention_heads, qhd = cfg.mla_q_head_dim();
    auto n = [&](const std::string& s) { return names.layer(i, "self_attn." + s); };
    if (cfg.q_lora_rank > 0) {
      mat(w.q_a_proj, n("q_a_proj.weight"), cfg.q_lora_rank, H, ShardRule::replicated);
      vec(w.q_a_layernorm, n("q_a_layernorm.weight"), cfg.q_lora_rank);
      mat(w.q_b_proj, n("q_b_proj.weight"), nh * qhd, cfg.q_lora_rank, ShardRule::column);
    } else {
      mat(w.q_proj, n("q_proj.weight"), nh * qhd, H, ShardRule::column);
    }
    mat(w.kv_a_proj_with_mqa, n("kv_a_proj_with_mqa.weight"), cfg.mla_cache_row(), H, ShardRule::replicated);
    vec(w.kv_a_layernorm, n("kv_a_layernorm.weight"), cfg.kv_lora_rank);
    mat(w.kv_b_proj, n("kv_b_proj.weight"), nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank,
        ShardRule::column);
    mat(w.o_proj, n("o_proj.weight"), H, nh * cfg.v_head_dim, ShardRule::row);
    if (cfg.mla_use_output_gate) mat(w.g_proj, n("g_proj.weight"), nh * cfg.v_head_dim, H, ShardRule::column);
  }

  void dense_mlp(int i, const std::string& prefix, int64_t inter, MlpWeights& w) {
    const int64_t H = cfg.hidden_size;
    mat(w.gate, names.layer(i, prefix + "gate_proj.weight"), inter, H, ShardRule::column);
    mat(w.up, names.layer(i, prefix + "up_proj.weight"), inter, H, ShardRule::column);
    mat(w.down, names.layer(i, prefix + "down_proj.weight"), H, inter, ShardRule::row);
  }

  void moe(int i, MoeWeights& w) {
    const int64_t H = cfg.hidden_size, E = cfg.num_experts, D = cfg.expert_io_dim(), I = cfg.moe_intermediate_size;
    // The router stays F32 on every backend: its logits are fp32 from the full-width x.
    sink.f32(w.router.w, names.layer(i, "block_sparse_moe.gate.weight"), DType::BF16, {E, H}, E, H,
             layout.split_router ? ShardRule::column : ShardRule::replicated);
    w.router.out = static_cast<int>(w.router.w.rows);  // this rank's experts' rows when split
    w.router.in = static_cast<int>(H);
    vec(w.router_bias, names.layer(i, "block_sparse_moe.gate.e_score_correction_bias"), E, DType::F32);
    sink.experts(w.w1, i, ExpertMatrix::w1, static_cast<int>(E), static_cast<int>(I), static_cast<int>(D));
    sink.experts(w.w2, i, ExpertMatrix::w2, static_cast<int>(E), static_cast<int>(D), static_cast<int>(I));
    sink.experts(w.w3, i, ExpertMatrix::w3, static_cast<int>(E), static_cast<int>(I), static_cast<int>(D));
    if (cfg.num_shared_experts > 0)
      dense_mlp(i, "block_sparse_moe.shared_experts.", cfg.shared_intermediate_size(), w.shared);
    if (cfg.routed_expert_hidden_size > 0) {
      mat(w.latent_down, names.layer(i, "block_sparse_moe.routed_expert_down_proj.weight"), D, H,
          layout.split_latent_moe ? ShardRule::column : ShardRule::replicated);
      mat(w.latent_up, names.layer(i, "block_sparse_moe.routed_expert_up_proj.weight"), H, D,
          layout.split_latent_up ? ShardRule::row : ShardRule::replicated);
      if (cfg.latent_moe_use_norm) vec(w.latent_norm, names.layer(i, "block_sparse_moe.routed_expert_norm.weight"), D);
    }
  }
};

// The weights a layer's attention reads, and those of its MLP part, first-read first: what
// the forward hints to the backend before the collective that precedes them
// (Ops::prefetch_during_next_collective).
std::vector<Tensor> attention_weights(const LayerSpec& spec, const KimiK3LayerWeights& lw) {
  return spec.attn == LayerKind::kda ? kda_weights_read_order(lw.kda) : mla_weights_read_order(lw.mla);
}
std::vector<Tensor> mlp_weights(const LayerSpec& spec, const KimiK3LayerWeights& lw) {
  return spec.mlp == MlpKind::dense ? mlp_weights_read_order(lw.mlp) : moe_weights_read_order(lw.moe);
}

}  // namespace

void describe_kimi_k3_weights(const ModelConfig& cfg, KimiK3Weights& w, WeightSink& sink, const WeightLayout& layout) {
  Lister l{cfg, sink, TensorNames(cfg), layout};
  const StageLayers& stage = layout.stage;
  const int64_t H = cfg.hidden_size;
  if (stage.first()) l.mat(w.embed_tokens, l.names.global("embed_tokens.weight"), cfg.vocab_size, H, ShardRule::vocab);
  w.layers.resize(cfg.num_hidden_layers);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    if (!stage.has(i)) continue;
    KimiK3LayerWeights& lw = w.layers[i];
    l.vec(lw.input_layernorm, l.names.layer(i, "input_layernorm.weight"), H);
    l.vec(lw.post_attention_layernorm, l.names.layer(i, "post_attention_layernorm.weight"), H);
    if (cfg.attn_res_block_size > 0) {
      l.vec(lw.attn_res_norm, l.names.layer(i, "self_attention_res_norm.weight"), H);
      sink.f32(lw.attn_res_proj, l.names.layer(i, "self_attention_res_proj.weight"), DType::BF16, {1, H}, 1, H,
               ShardRule::replicated);
      l.vec(lw.mlp_res_norm, l.names.layer(i, "mlp_res_norm.weight"), H);
      sink.f32(lw.mlp_res_proj, l.names.layer(i, "mlp_res_proj.weight"), DType::BF16, {1, H}, 1, H,
               ShardRule::replicated);
    }
    if (cfg.layers[i].attn == LayerKind::kda) l.kda(i, lw.kda);
    else l.mla(i, lw.mla);
    if (cfg.layers[i].mlp == MlpKind::dense) l.dense_mlp(i, "mlp.", cfg.intermediate_size, lw.mlp);
    else l.moe(i, lw.moe);
  }
  // The output mix reads every block summary: the last stage's. Norm and lm_head go round to
  // the first stage (model/pipeline.h: the ring), which samples.
  if (stage.last() && cfg.attn_res_block_size > 0) {
    l.vec(w.output_attn_res_norm, l.names.global("output_attn_res_norm.weight"), H);
    sink.f32(w.output_attn_res_proj, l.names.global("output_attn_res_proj.weight"), DType::BF16, {1, H}, 1, H,
             ShardRule::replicated);
  }
  if (stage.first()) {
    l.vec(w.norm, l.names.global("norm.weight"), H);
    if (cfg.tie_word_embeddings) w.lm_head = w.embed_tokens;
    else l.mat(w.lm_head, cfg.lm_head_name, cfg.vocab_size, H, ShardRule::vocab);
    describe_moonvit_weights(cfg, w.vision, sink);
  }
}

// ---- the model ---------------------------------------------------------------------------

KimiK3::KimiK3(const ModelConfig& cfg, KimiK3Weights weights, size_t weight_bytes, TensorParallel tp,
               std::vector<DsaIndexerWeights> indexers, StageLayers stage)
    : cfg_(cfg),
      w_(std::move(weights)),
      weight_bytes_(weight_bytes),
      tp_(tp),
      stage_(stage),
      vocab_begin_(tp.dp_attention ? 0 : static_cast<int64_t>(cfg.vocab_size) / tp.size * tp.rank),
      kda_shape_(kda_shape(cfg)),
      mla_dims_(mla_dims(cfg)),
      indexers_(std::move(indexers)),
      dsa_dims_{{cfg.dsa.index_n_heads, cfg.dsa.index_head_dim}, cfg.dsa.index_topk, cfg.dsa.k_norm_eps,
                dsa_score_block_bytes()},
      moe_dims_(moe_dims(cfg)),
      act_(activation_params(cfg)),
      vision_(cfg, std::move(w_.vision)) {
  // check_parallel_split() made sure these divide.
  kda_shape_.num_heads /= tp.size;
  mla_dims_.attn.num_heads /= tp.size;
  MR_CHECK(indexers_.size() == static_cast<size_t>(cfg.num_dsa_layers))
      << indexers_.size() << " DSA indexers for " << cfg.num_dsa_layers << " DSA layers";
  moe_dims_.split_router = tp.split_router;
  moe_dims_.split_latent = tp.split_latent_moe;
  moe_dims_.split_latent_up = tp.split_latent_up;
  moe_dims_.tp_rank = tp.rank;
  moe_dims_.shared_whole = tp.dp_attention;
  mla_dims_.reduce_output = !tp.dp_attention;
  stage_.first_layer = std::clamp(stage_.first_layer, 0, cfg.num_hidden_layers);
  stage_.end_layer = std::clamp(stage_.end_layer, stage_.first_layer, cfg.num_hidden_layers);
  for (int i = 0; i < stage_.first_layer; ++i) {
    const LayerSpec& spec = cfg.layers[i];
    kda_base_ += spec.attn == LayerKind::kda;
    mla_base_ += spec.attn != LayerKind::kda;
    dsa_base_ += spec.dsa_index >= 0;
  }
}

CacheSpec KimiK3::cache_spec_of_layers(int first_layer, int end_layer) const {
  // A stage's layers only (all of them without pipeline parallelism).
  int kda = 0, mla = 0, dsa = 0;
  for (int i = std::max(first_layer, 0); i < std::min(end_layer, cfg_.num_hidden_layers); ++i) {
    kda += cfg_.layers[i].attn == LayerKind::kda;
    mla += cfg_.layers[i].attn != LayerKind::kda;
    dsa += cfg_.layers[i].dsa_index >= 0;
  }
  CacheSpec spec;
  spec.state_floats_per_slot = kda * kda_state_floats(kda_shape_);
  spec.kv_layers = mla;
  spec.kv_row_width = cfg_.mla_cache_row();
  // K3.1: each DSA layer's indexer keys, a row kind on the latent rows' pages.
  spec.index_layers = dsa;
  spec.index_dtype = index_dtype_;  // F32 rows of head_dim, or FP8 codes + a scale (backend/dsa_index_row.h)
  spec.index_row_width = dsa == 0                          ? 0
                         : index_dtype_ == DType::F8_E4M3 ? dsa_fp8_row_width(cfg_.dsa.index_head_dim)
                                                          : cfg_.dsa.index_head_dim;
  return spec;
}

int64_t KimiK3::scratch_bytes(int tokens_per_step) const {
  // Generously, per new token: the logits row, the residual stream and AttnRes blocks, the
  // widest layer's activations (KDA's projections or the routed experts' per-choice rows);
  // plus plain-mode MLA's expansion of one block of keys (ops.h: mla_prefill_key_block), in
  // the larger of the CUDA backend's two forms (bf16 expansion + packed tiles, or fp32).
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size;
  const int64_t blocks = c.attn_res_block_size > 0 ? (c.num_hidden_layers + c.attn_res_block_size - 1) / c.attn_res_block_size : 0;
  const int64_t stream = (8 + blocks) * H * 4;
  const int64_t kda = 16 * static_cast<int64_t>(c.kda_proj_dim()) * 4;
  const int64_t experts = static_cast<int64_t>(std::max(c.num_experts_per_token, 1)) *
                          (4 * std::max(c.moe_intermediate_size, 1) + 2 * c.expert_io_dim()) * 4;
  const int64_t shared = 4 * static_cast<int64_t>(std::max(c.intermediate_size, c.shared_intermediate_size())) * 4;
  const int64_t mla_q = 4 * static_cast<int64_t>(c.num_attention_heads) * (c.mla_q_head_dim() + c.v_head_dim) * 4;
  const int64_t per_token = static_cast<int64_t>(c.vocab_size) * 4 + stream + std::max({kda, experts + shared, mla_q}) +
                            2 * H * 4;
  int64_t mla_blocks = 0;
  if (c.num_mla_layers > 0) {
    const int64_t heads = c.num_attention_heads, dqk = c.mla_q_head_dim(), dv = c.v_head_dim;
    const int64_t kv = heads * (c.qk_nope_head_dim + dv), lora = c.kv_lora_rank, pe = c.qk_rope_head_dim;
    const int64_t per_key = std::max(2 * (lora + pe + kv) + 2 * heads * (dqk + dv),  // bf16 expansion + tiles
                                     4 * (lora + kv));                               // fp32 expansion
    const int64_t per_query = 2 * heads * dqk + 4 * heads * (dv + 2) + 8 * heads;    // Q tiles, a block's o and lse
    const int64_t keys = mla_prefill_key_block(std::max(tokens_per_step, 1)) + 128;   // tiles round up to 128
    mla_blocks = keys * per_key + (std::max(tokens_per_step, 1) + 128) * per_query + (int64_t{1} << 20);
  }
  const int64_t dsa = c.num_dsa_layers > 0 ? dsa_scratch_bytes(dsa_dims_, tokens_per_step) : 0;
  const int64_t text = per_token * std::max(tokens_per_step, 1) + mla_blocks + dsa + (int64_t{256} << 20);
  // The tower runs between steps in the same scratch: the larger of the two.
  return std::max(text, vision_.scratch_bytes(max_image_patches(tokens_per_step)));
}

int64_t KimiK3::replay_floats_per_token() const {
  int kda = 0;  // this stage's
  for (int i = stage_.first_layer; i < stage_.end_layer; ++i) kda += cfg_.layers[i].attn == LayerKind::kda;
  return static_cast<int64_t>(kda) * kda_replay_floats_per_token(kda_shape_);
}

void KimiK3::replay_state(Ops& ops, const BatchView& batch, const CachePools& pools) {
  if (pools.replay.empty() || pools.state.empty() || batch.n_tokens() == 0) return;
  ScratchScope scope(ops);
  // [n] the replayed tokens' saved rows, in the batch's id table (backend memory).
  const Tensor index{const_cast<int32_t*>(batch.token_ids), DType::I32, batch.n_tokens(), 1};
  const int64_t kda_floats = kda_state_floats(kda_shape_);
  const int64_t per_layer = pools.replay.rows * kda_replay_floats_per_token(kda_shape_);
  for (int i = stage_.first_layer; i < stage_.end_layer; ++i) {
    const LayerSpec& spec = cfg_.layers[i];
    if (spec.attn != LayerKind::kda) continue;
    const int k = spec.kda_index - kda_base_;  // this stage's pools hold its own layers
    const StateLayer state{pools.state.as<float>() + k * kda_floats, pools.state.cols};
    const KdaSavedInputs from{index, pools.replay.as<float>() + k * per_layer, pools.replay.rows};
    kda_replay(ops, w_.layers[i].kda, kda_shape_, batch, state, kda_mode_, from);
  }
}

bool KimiK3::set_taps(std::vector<int> layers) {
  if (stage_.num_stages > 1) return false;  // a draft reads every layer's rows on one rank
  tap_of_layer_.assign(cfg_.num_hidden_layers, -1);
  for (size_t j = 0; j < layers.size(); ++j) {
    if (layers[j] < 0 || layers[j] >= cfg_.num_hidden_layers) return false;
    tap_of_layer_[layers[j]] = static_cast<int>(j);
  }
  if (layers.empty()) tap_of_layer_.clear();
  return true;
}

DraftSharedWeights KimiK3::draft_shared() const {
  if (tp_.size != 1 || stage_.num_stages > 1) return {};
  return {&w_.embed_tokens, &w_.lm_head};
}

uint32_t KimiK3::graph_variant(const ForwardBatch& batch) const {
  if (cfg_.num_dsa_layers == 0) return 0;
  // The DSA layers' score width, a power of two: its exponent.
  uint32_t log2_columns = 0;
  for (int64_t c = dsa_score_columns(batch); c > 1; c >>= 1) ++log2_columns;
  return log2_columns;
}

void KimiK3::forward(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor logits) {
  ScratchScope scope(ops);
  if (tp_.dp_attention && batch.n_tokens() == 0)
    return dp_attention_idle_step(ops, cfg_, stage_, w_.layers, moe_dims_, *batch.host);
  forward_in_parts(ops, batch, pools, logits);
}

void KimiK3::forward_body(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor rows) {
  ScratchScope scope(ops);
  const int64_t T = batch.n_tokens(), H = cfg_.hidden_size;
  const int B = cfg_.attn_res_block_size;
  const float eps = cfg_.rms_norm_eps;
  const DType act = ops.act_dtype();

  // Where layer i's caches live: a KDA layer's region of every state slot, an MLA layer's pages.
  const int64_t kda_floats = kda_state_floats(kda_shape_);
  auto state_of = [&](const LayerSpec& spec) {
    return StateLayer{pools.state.as<float>() + (spec.kda_index - kda_base_) * kda_floats, pools.state.cols};
  };
  auto kv_of = [&](const LayerSpec& spec) {
    const int64_t layer_rows = static_cast<int64_t>(pools.num_pages) * pools.page_size_tokens;
    return KvLayer{pools.kv.rows_view((spec.mla_index - mla_base_) * layer_rows, layer_rows).data, pools.kv.dtype,
                   pools.page_size_tokens, static_cast<int>(pools.kv.cols)};
  };
  auto keys_of = [&](const LayerSpec& spec) {  // a DSA layer's indexer keys, on the same pages
    const int64_t layer_rows = static_cast<int64_t>(pools.num_pages) * pools.page_size_tokens;
    return KvLayer{pools.index_kv.rows_view((spec.dsa_index - dsa_base_) * layer_rows, layer_rows).data,
                   pools.index_kv.dtype,
                   pools.page_size_tokens, static_cast<int>(pools.index_kv.cols)};
  };

  const ForwardBatch& host = *batch.host;
  Tensor h = ops.scratch(T, H, DType::F32);  // the layer input, then its output
  if (stage_.first()) {
    ops.embedding(w_.embed_tokens.w, vocab_begin_, batch, h);
    // Each rank looked up the ids of its vocabulary rows (under DP attention: all of them).
    if (!tp_.dp_attention) ops.all_reduce_sum(h);
  }
  if (stage_.first()) put_given_rows(ops, host, h);  // an image's rows at its placeholders

  // Speculative decoding: the verified rows' recurrent inputs, per KDA layer (replay_state).
  // A step that saves every row in order (a verify step, the shape a graph captures) copies
  // them; another uploads the rows' index (never inside a graph).
  Tensor save_index;
  bool save_all = false, saving = false;
  if (!host.save_rows.empty() && !pools.replay.empty()) {
    const int64_t n = static_cast<int64_t>(host.save_rows.size());
    MR_CHECK(n <= pools.replay.rows) << n << " rows to save, room for " << pools.replay.rows;
    saving = true;
    save_all = n == T;
    for (int64_t i = 0; i < n && save_all; ++i) save_all = host.save_rows[i] == i;
    if (!save_all) {
      save_index = ops.scratch(n, 1, DType::I32);  // [n] batch token rows
      ops.upload(save_index, 0, host.save_rows.data(), host.save_rows.size() * sizeof(int32_t));
    }
  }
  const int64_t replay_per_layer = pools.replay.rows * kda_replay_floats_per_token(kda_shape_);
  auto saved_of = [&](const LayerSpec& spec) {
    return KdaSavedInputs{save_index, pools.replay.as<float>() + (spec.kda_index - kda_base_) * replay_per_layer,
                          pools.replay.rows};
  };

  // Attention Residuals: the completed block summaries, block i at rows [i*T, (i+1)*T).
  const int max_blocks = B > 0 ? (cfg_.num_hidden_layers + B - 1) / B : 0;
  Tensor blocks = max_blocks ? ops.scratch(max_blocks * T, H, DType::F32) : Tensor{};
  int n_blocks = 0;
  Tensor x = ops.scratch(T, H, DType::F32);       // a sub-layer's input (the mix)
  Tensor a = ops.scratch(T, H, DType::F32);       // attention output
  Tensor prefix = ops.scratch(T, H, DType::F32);  // the running in-block sum
  Tensor m = ops.scratch(T, H, DType::F32);       // MLP output
  Tensor xn = ops.scratch(T, H, DType::F32);      // normed, F32 (the router's input)
  Tensor xa = act == DType::F32 ? xn : ops.scratch(T, H, act);  // normed, the projections' input

  // A later pipeline stage starts from what the previous one ended with: the residual
  // stream and, under AttnRes, the block summaries completed so far (one per block start
  // among the earlier layers).
  if (!stage_.first()) {
    ops.pipe_recv(h);
    if (B > 0) n_blocks = (stage_.first_layer + B - 1) / B;
    if (n_blocks > 0) ops.pipe_recv(blocks.rows_view(0, n_blocks * T));
  }

  // The L2 prefetch hints matter only where collectives wait on other ranks.
  const bool prefetch = ops.parallel_size() > 1 && !tp_.dp_attention;
  for (int i = stage_.first_layer; i < stage_.end_layer; ++i) {
    const LayerSpec& spec = cfg_.layers[i];
    const KimiK3LayerWeights& lw = w_.layers[i];
    const bool block_start = B > 0 && i % B == 0;

    // 1. The attention input: a mix over depth (or the residual stream itself).
    Tensor attn_in = h;
    if (B > 0 && n_blocks > 0) {
      ops.attn_res_mix(h, blocks, n_blocks, lw.attn_res_norm, lw.attn_res_proj, eps, x);
      attn_in = x;
    }
    if (block_start) ops.copy(h, blocks.rows_view(n_blocks++ * T, T));

    // 2. Attention: KDA (linear) or MLA (full), through the sequences' caches. Its output's
    // all-reduce may pull the MLP part's weights into L2 meanwhile (a hint; issue #41).
    if (prefetch) ops.prefetch_during_next_collective(mlp_weights(spec, lw));
    ops.rmsnorm(attn_in, lw.input_layernorm, eps, xa);
    if (spec.attn == LayerKind::kda) {
      const KdaSavedInputs save = saved_of(spec);
      kda_forward(ops, lw.kda, kda_shape_, xa, batch, state_of(spec), kda_mode_, a, saving ? &save : nullptr,
                  /*reduce=*/!tp_.dp_attention);
    } else if (spec.dsa_index >= 0) {
      dsa_forward(ops, lw.mla, indexers_[spec.dsa_index], mla_dims_, dsa_dims_, xa, batch, kv_of(spec),
                  keys_of(spec), mla_mode_, a);
    } else mla_forward(ops, lw.mla, mla_dims_, xa, batch, kv_of(spec), mla_mode_, a);

    // 3. The running sum: restarts at each block start under AttnRes (plain residual without).
    if (block_start) ops.copy(a, prefix);
    else ops.add(h, a, prefix);

    // 4. The MLP input: again a mix over depth under AttnRes.
    Tensor mlp_in = prefix;
    if (B > 0) {
      ops.attn_res_mix(prefix, blocks, n_blocks, lw.mlp_res_norm, lw.mlp_res_proj, eps, x);
      mlp_in = x;
    }

    // 5. MLP: dense (first_k_dense_replace) or MoE; the layer's output is prefix + m. Its
    // collective may pull the next layer's attention weights into L2 meanwhile.
    if (prefetch && i + 1 < stage_.end_layer)
      ops.prefetch_during_next_collective(attention_weights(cfg_.layers[i + 1], w_.layers[i + 1]));
    if (spec.mlp == MlpKind::dense) {
      ops.rmsnorm(mlp_in, lw.post_attention_layernorm, eps, xa);
      mlp_forward(ops, lw.mlp, act_, xa, m, /*reduce=*/!tp_.dp_attention);
    } else {
      ops.rmsnorm(mlp_in, lw.post_attention_layernorm, eps, xn);
      if (xa.data != xn.data) ops.copy(xn, xa);
      if (tp_.dp_attention) moe_forward_dp(ops, lw.moe, moe_dims_, xn, xa, host.dp_tokens, host.dp_rank, m);
      else moe_forward(ops, lw.moe, moe_dims_, xn, xa, m);
    }
    ops.add(prefix, m, h);
    if (!tap_of_layer_.empty() && tap_of_layer_[i] >= 0) {
      MR_CHECK(!pools.taps.empty() && T <= pools.taps_stride_rows)
          << T << " tokens, taps hold " << pools.taps_stride_rows;
      ops.copy(h, pools.taps.rows_view(tap_of_layer_[i] * pools.taps_stride_rows, T));
    }
  }
  MR_CHECK(rows.rows == batch.n_logit_rows() && rows.cols == H) << "forward_body: rows " << rows.rows << " x " << rows.cols;
  if (!stage_.last()) {  // the next stage goes on from here
    ops.pipe_send(h);
    if (n_blocks > 0) ops.pipe_send(blocks.rows_view(0, n_blocks * T));
  } else {
    if (B > 0) {
      ops.attn_res_mix(h, blocks, n_blocks, w_.output_attn_res_norm, w_.output_attn_res_proj, eps, x);
      h = x;
    }
    ops.gather_rows(h, batch.logit_rows, rows);
  }
}

void KimiK3::forward_head(Ops& ops, Tensor rows, Tensor logits) {
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
    // Each rank's vocabulary columns, gathered into every rank's full logits.
    Tensor local = ops.scratch(R, w_.lm_head.out, DType::F32);
    ops.linear(normed, w_.lm_head, local);
    ops.all_gather_cols(local, logits);
  }
}

}  // namespace moonrun
