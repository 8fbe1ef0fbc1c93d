#include "model/dspark_draft.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "common/debug_phases.h"
#include "model/checkpoint.h"
#include "model/loader.h"

namespace moonrun {

namespace {

using json = nlohmann::json;

// A field of the DSpark block: SGLang's prefixed key, then "dspark_config", then the top level.
const json* dspark_field(const json& c, const std::string& key) {
  if (auto it = c.find("dspark_" + key); it != c.end() && !it->is_null()) return &*it;
  if (auto d = c.find("dspark_config"); d != c.end() && d->is_object())
    if (auto it = d->find(key); it != d->end() && !it->is_null()) return &*it;
  if (auto it = c.find(key); it != c.end() && !it->is_null()) return &*it;
  return nullptr;
}

Status need_int(const json& c, const std::string& key, int& out) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer())
    return invalid_argument("DSpark draft config.json: \"" + key + "\" must be an integer");
  out = it->get<int>();
  return Status::ok();
}

}  // namespace

Result<DSparkConfig> parse_dspark_config(const json& c) {
  DSparkConfig d;
  if (c.value("speculators_model_type", "") == "dspark")
    return invalid_argument(
        "DSpark draft: a speculators-format checkpoint (speculators_model_type \"dspark\") trains block slot j "
        "to predict anchor+j; moonrun reads the DeepSpec convention (slot k predicts anchor+k+1), as SGLang does");
  MR_RETURN_IF_ERROR(need_int(c, "hidden_size", d.hidden_size));
  MR_RETURN_IF_ERROR(need_int(c, "num_hidden_layers", d.num_layers));
  MR_RETURN_IF_ERROR(need_int(c, "num_attention_heads", d.num_heads));
  MR_RETURN_IF_ERROR(need_int(c, "kv_lora_rank", d.kv_lora_rank));
  MR_RETURN_IF_ERROR(need_int(c, "qk_nope_head_dim", d.qk_nope_head_dim));
  MR_RETURN_IF_ERROR(need_int(c, "qk_rope_head_dim", d.qk_rope_head_dim));
  MR_RETURN_IF_ERROR(need_int(c, "v_head_dim", d.v_head_dim));
  MR_RETURN_IF_ERROR(need_int(c, "intermediate_size", d.intermediate_size));
  MR_RETURN_IF_ERROR(need_int(c, "vocab_size", d.vocab_size));
  if (auto it = c.find("q_lora_rank"); it != c.end() && it->is_number_integer()) d.q_lora_rank = it->get<int>();
  if (d.q_lora_rank <= 0) return invalid_argument("DSpark draft config.json: q_lora_rank must be set (MLA drafts)");
  const int kv_heads = c.value("num_key_value_heads", d.num_heads);
  if (kv_heads != d.num_heads)
    return invalid_argument("DSpark draft: num_key_value_heads " + std::to_string(kv_heads) + " != heads " +
                            std::to_string(d.num_heads) + "; moonrun runs the MLA-native drafts (the K3 recipes')");
  if (!c.contains("kv_lora_rank"))
    return invalid_argument("DSpark draft: not an MLA draft (no kv_lora_rank); GQA DSpark drafts are not supported");
  const std::string act = c.value("hidden_act", "silu");
  if (act != "silu") return invalid_argument("DSpark draft: hidden_act \"" + act + "\" (moonrun runs silu)");
  d.rms_norm_eps = c.value("rms_norm_eps", 1e-6f);
  d.rope_theta = c.value("rope_theta", 10000.0f);
  if (auto rs = c.find("rope_scaling"); rs != c.end() && rs->is_object()) {
    const std::string type = rs->value("rope_type", rs->value("type", ""));
    if (type == "yarn") {
      d.rope_scaling.yarn = true;
      d.rope_scaling.factor = rs->value("factor", 1.0f);
      d.rope_scaling.original_max_position_embeddings = rs->value("original_max_position_embeddings", 0);
      d.rope_scaling.beta_fast = rs->value("beta_fast", 32.0f);
      d.rope_scaling.beta_slow = rs->value("beta_slow", 1.0f);
      d.rope_scaling.mscale = rs->value("mscale", 1.0f);
      d.rope_scaling.mscale_all_dim = rs->value("mscale_all_dim", 0.0f);
    } else if (!type.empty() && type != "default") {
      return invalid_argument("DSpark draft: rope_scaling type \"" + type + "\" (moonrun reads yarn)");
    }
  }
  const json* block = dspark_field(c, "block_size");
  const json* mask = dspark_field(c, "mask_token_id");
  if (!mask) mask = dspark_field(c, "noise_token_id");
  const json* taps = dspark_field(c, "target_layer_ids");
  const json* rank = dspark_field(c, "markov_rank");
  if (!block || !block->is_number_integer() || block->get<int>() < 1)
    return invalid_argument("DSpark draft config.json: dspark_config.block_size must be a positive integer");
  if (!mask || !mask->is_number_integer())
    return invalid_argument("DSpark draft config.json: dspark_config.mask_token_id must be set");
  if (!taps || !taps->is_array() || taps->empty())
    return invalid_argument("DSpark draft config.json: dspark_config.target_layer_ids must be a non-empty list");
  if (!rank || !rank->is_number_integer() || rank->get<int>() <= 0)
    return invalid_argument("DSpark draft config.json: dspark_config.markov_rank must be > 0 (the Markov head)");
  d.block_size = block->get<int>();
  d.mask_token_id = mask->get<int>();
  for (const json& t : *taps) {
    if (!t.is_number_integer()) return invalid_argument("DSpark draft: target_layer_ids must be integers");
    d.target_layer_ids.push_back(t.get<int>());
  }
  d.markov_rank = rank->get<int>();
  if (const json* type = dspark_field(c, "markov_head_type"); type && type->is_string() && *type != "vanilla")
    return invalid_argument("DSpark draft: markov_head_type \"" + type->get<std::string>() +
                            "\" (moonrun runs the vanilla head)");
  if (const json* on = dspark_field(c, "enable_confidence_head"); on && on->is_boolean()) d.confidence_head = *on;
  if (const json* wm = dspark_field(c, "confidence_head_with_markov"); wm && wm->is_boolean())
    d.confidence_with_markov = *wm;
  if (d.block_size > kShortSeqMaxNewTokens)
    return invalid_argument("DSpark draft: block_size " + std::to_string(d.block_size) + " > " +
                            std::to_string(kShortSeqMaxNewTokens));
  return d;
}

Status check_dspark_fits(const DSparkConfig& d, const ModelConfig& t) {
  if (d.hidden_size != t.hidden_size)
    return invalid_argument("DSpark draft: hidden_size " + std::to_string(d.hidden_size) + " != the target's " +
                            std::to_string(t.hidden_size));
  if (d.vocab_size != t.vocab_size)
    return invalid_argument("DSpark draft: vocab_size " + std::to_string(d.vocab_size) + " != the target's " +
                            std::to_string(t.vocab_size));
  for (int l : d.target_layer_ids)
    if (l < 0 || l >= t.num_hidden_layers)
      return invalid_argument("DSpark draft: target layer " + std::to_string(l) + " is outside the target's " +
                              std::to_string(t.num_hidden_layers) + " layers");
  if (d.mask_token_id < 0 || d.mask_token_id >= t.vocab_size)
    return invalid_argument("DSpark draft: mask_token_id " + std::to_string(d.mask_token_id) +
                            " is outside the target's vocabulary");
  return Status::ok();
}

Result<std::unique_ptr<DSparkDraft>> DSparkDraft::load(Ops& ops, const std::string& dir, const ModelConfig& target,
                                                       bool log_progress) {
  auto ckpt = MR_TRY(Checkpoint::open(dir));
  DSparkConfig cfg = MR_TRY(parse_dspark_config(ckpt->config()));
  if (auto st = check_dspark_fits(cfg, target); !st.is_ok())
    return invalid_argument(ckpt->dir() + ": " + st.message());
  std::unique_ptr<DSparkDraft> m(new DSparkDraft());
  m->cfg_ = cfg;
  m->dir_ = ckpt->dir();
  m->mla_.hidden = cfg.hidden_size;
  m->mla_.q_lora_rank = cfg.q_lora_rank;
  m->mla_.attn = MlaShape{cfg.num_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim};
  m->mla_.q_a_norm_eps = m->mla_.kv_a_norm_eps = cfg.rms_norm_eps;
  m->rope_ = RopeTable(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling);

  const size_t before = ops.allocated_bytes();
  ModelConfig names_cfg;  // the loader's names are spelled out here in full
  LoadOptions opts;
  opts.log_progress = log_progress;
  WeightLoader loader(ops, *ckpt, names_cfg, opts);
  const int64_t H = cfg.hidden_size, nh = cfg.num_heads, qhd = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim;
  auto vec = [&](Tensor& dst, const std::string& name, int64_t n) {
    loader.f32(dst, name, DType::BF16, {n}, 1, n, ShardRule::replicated);
  };
  auto mat = [&](Matrix& dst, const std::string& name, int64_t out, int64_t in) {
    loader.matrix(dst, name, static_cast<int>(out), static_cast<int>(in), ShardRule::replicated);
  };
  vec(m->hidden_norm, "hidden_norm.weight", H);
  vec(m->norm, "norm.weight", H);
  m->layers_.resize(cfg.num_layers);
  for (int i = 0; i < cfg.num_layers; ++i) {
    Layer& l = m->layers_[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    vec(l.input_layernorm, p + "input_layernorm.weight", H);
    vec(l.post_attention_layernorm, p + "post_attention_layernorm.weight", H);
    mat(l.attn.q_a_proj, p + "self_attn.q_a_proj.weight", cfg.q_lora_rank, H);
    vec(l.attn.q_a_layernorm, p + "self_attn.q_a_layernorm.weight", cfg.q_lora_rank);
    mat(l.attn.q_b_proj, p + "self_attn.q_b_proj.weight", nh * qhd, cfg.q_lora_rank);
    mat(l.attn.kv_a_proj_with_mqa, p + "self_attn.kv_a_proj_with_mqa.weight", cfg.cache_row_width(), H);
    vec(l.attn.kv_a_layernorm, p + "self_attn.kv_a_layernorm.weight", cfg.kv_lora_rank);
    mat(l.attn.kv_b_proj, p + "self_attn.kv_b_proj.weight", nh * (cfg.qk_nope_head_dim + cfg.v_head_dim),
        cfg.kv_lora_rank);
    mat(l.attn.o_proj, p + "self_attn.o_proj.weight", H, nh * cfg.v_head_dim);
    mat(l.mlp.gate, p + "mlp.gate_proj.weight", cfg.intermediate_size, H);
    mat(l.mlp.up, p + "mlp.up_proj.weight", cfg.intermediate_size, H);
    mat(l.mlp.down, p + "mlp.down_proj.weight", H, cfg.intermediate_size);
  }
  // The Markov and confidence heads (Ops::dspark_markov) read F32.
  Tensor w1, w2, conf_w, conf_b;
  const int64_t V = cfg.vocab_size, r = cfg.markov_rank;
  loader.f32(w1, "markov_head.markov_w1.weight", DType::BF16, {V, r}, V, r, ShardRule::replicated);
  loader.f32(w2, "markov_head.markov_w2.weight", DType::BF16, {V, r}, V, r, ShardRule::replicated);
  const int64_t conf_in = H + (cfg.confidence_with_markov ? r : 0);
  if (cfg.confidence_head) {
    loader.f32(conf_w, "confidence_head.proj.weight", DType::BF16, {1, conf_in}, 1, conf_in, ShardRule::replicated);
    loader.f32(conf_b, "confidence_head.proj.bias", DType::BF16, {1}, 1, 1, ShardRule::replicated);
  }
  MR_RETURN_IF_ERROR(loader.finish());
  // fc [hidden, n_taps * hidden] as one [hidden, hidden] block per tap: the columns a rank j
  // of n_taps holds under the row rule, so each tap projects straight from its own rows.
  m->fc_.resize(cfg.n_taps());
  for (int j = 0; j < cfg.n_taps(); ++j) {
    LoadOptions part;
    part.rank = j;
    part.world_size = cfg.n_taps();
    WeightLoader fc_loader(ops, *ckpt, names_cfg, part);
    fc_loader.matrix(m->fc_[j], "fc.weight", static_cast<int>(H), static_cast<int>(H * cfg.n_taps()), ShardRule::row);
    MR_RETURN_IF_ERROR(fc_loader.finish());
  }
  ops.synchronize();
  m->markov_w1_ = w1;
  m->markov_w2_ = w2;
  if (cfg.confidence_head) {
    m->confidence_w_ = conf_w;
    ops.download(conf_b, &m->confidence_b_);
  }
  // YaRN widens the softmax scale by mscale^2; the attention op's scale is fixed, and the
  // queries are linear in q_a_layernorm's weight, so the factor goes there.
  if (m->rope_.softmax_scale_factor() != 1.0f)
    for (Layer& l : m->layers_) fold_softmax_factor(ops, l.attn.q_a_layernorm, m->rope_.softmax_scale_factor());
  ops.synchronize();
  m->weight_bytes_ = ops.allocated_bytes() - before;
  return m;
}

int DSparkDraft::spare_pages_for(int max_seqs, int page_size_tokens) const {
  // A block of B rows from any position touches at most ceil(B / P) + 1 pages past the
  // ones holding the context.
  return max_seqs * ((cfg_.block_size + page_size_tokens - 1) / page_size_tokens + 1);
}

int64_t DSparkDraft::fixed_bytes(int max_seqs, int64_t max_positions) const {
  return max_positions * cfg_.qk_rope_head_dim * 4 + static_cast<int64_t>(max_seqs) * cfg_.block_size * 4;
}

DraftPool DSparkDraft::allocate_pool(Ops& ops, int num_pages, int page_size_tokens, DType kv_dtype, int max_seqs,
                                     int64_t max_positions) const {
  DraftPool pool;
  pool.num_pages = num_pages;
  pool.spare_pages = spare_pages_for(max_seqs, page_size_tokens);
  pool.page_size_tokens = page_size_tokens;
  pool.max_seqs = max_seqs;
  pool.kv = ops.alloc(cfg_.num_layers * pool.rows_per_layer(), cfg_.cache_row_width(), kv_dtype, "dspark draft cache");
  ops.zero(pool.kv);
  pool.rope = alloc_rope_rows(ops, rope_, max_positions, "dspark rope rows");
  const int B = cfg_.block_size;
  std::vector<int32_t> last(static_cast<size_t>(max_seqs) * B);
  for (size_t t = 0; t < last.size(); ++t) last[t] = static_cast<int32_t>(t / B * B + B - 1);
  pool.last_row = ops.alloc(static_cast<int64_t>(last.size()), 1, DType::I32, "dspark block rows");
  ops.upload(pool.last_row, 0, last.data(), last.size() * sizeof(int32_t));
  return pool;
}

KvLayer DSparkDraft::layer_cache(const DraftPool& pool, int layer) const {
  const int64_t rows = pool.rows_per_layer();
  return KvLayer{pool.kv.rows_view(layer * rows, rows).data, pool.kv.dtype, pool.page_size_tokens,
                 static_cast<int>(pool.kv.cols)};
}

void DSparkDraft::ingest(Ops& ops, const BatchView& batch, const Tensor& taps, int64_t taps_stride_rows,
                         const DraftPool& pool) {
  ScratchScope scope(ops);
  const int64_t T = batch.n_tokens(), H = cfg_.hidden_size;
  if (T == 0) return;
  const DType act = ops.act_dtype();
  // The context rows: RMSNorm(sum over taps of fc_j(tap_j)).
  Tensor ctx = ops.scratch(T, H, DType::F32), part = ops.scratch(T, H, DType::F32);
  Tensor tap_act = act == DType::F32 ? Tensor{} : ops.scratch(T, H, act);
  for (int j = 0; j < cfg_.n_taps(); ++j) {
    Tensor tap = taps.rows_view(j * taps_stride_rows, T);
    if (act != DType::F32) ops.copy(tap, tap_act);
    ops.linear(act == DType::F32 ? tap : tap_act, fc_[j], j == 0 ? ctx : part);
    if (j > 0) ops.add(ctx, part, ctx);
  }
  Tensor ctx_n = ops.scratch(T, H, act);
  ops.rmsnorm(ctx, hidden_norm, cfg_.rms_norm_eps, ctx_n);
  // Each layer's cache row of each token, k_pe rotated at the token's position (the rope
  // rows gathered on the device: ingest runs inside the step's graph).
  Tensor cs = ops.scratch(T, cfg_.qk_rope_head_dim, DType::F32);
  ops.gather_rows(pool.rope, batch.positions, cs);
  Tensor ckv = ops.scratch(T, cfg_.cache_row_width(), DType::F32);
  for (int i = 0; i < cfg_.num_layers; ++i) {
    ops.linear(ctx_n, layers_[i].attn.kv_a_proj_with_mqa, ckv);
    ops.rope_interleaved(ckv, cs, 1, cfg_.cache_row_width(), cfg_.kv_lora_rank);
    ops.mla_store(ckv, layers_[i].attn.kv_a_layernorm, cfg_.rms_norm_eps, batch, layer_cache(pool, i));
  }
}

void DSparkDraft::propose(Ops& ops, std::span<const DraftBlockRequest> requests, const DraftPool& pool,
                          const DraftSharedWeights& shared, std::vector<DraftBlockResult>& results, bool want_logits,
                          bool capture) {
  results.assign(requests.size(), {});
  if (requests.empty()) return;
  static DebugPhases phases("dspark propose", {"previous work", "batch upload", "pass", "download"});
  const auto sync = [&] { ops.synchronize(); };
  phases.start();
  phases.mark(0, sync);
  ScratchScope scope(ops);
  // A graph per shape: up to kMaxCapturedDraftSeqs sequences, padded to a power of two (so
  // a handful of captures serve every small batch; a padding block drafts nothing and
  // writes only spare pages). Larger batches run eagerly: their launches are a small part.
  const int real = static_cast<int>(requests.size());
  capture = capture && ops.captures() && real <= kMaxCapturedDraftSeqs;
  int padded = real;
  if (capture)
    while (padded & (padded - 1)) ++padded;
  padded = std::min(padded, pool.max_seqs);
  std::vector<DraftBlockRequest> with_padding;
  if (padded > real) {
    with_padding.assign(requests.begin(), requests.end());
    with_padding.resize(padded, DraftBlockRequest{{}, cfg_.mask_token_id, 0, 0});
    requests = std::span<const DraftBlockRequest>(with_padding);
  }
  const int S = static_cast<int>(requests.size()), B = cfg_.block_size, P = pool.page_size_tokens;
  const int64_t SB = static_cast<int64_t>(S) * B, H = cfg_.hidden_size, V = cfg_.vocab_size;
  const int nh = cfg_.num_heads, qhd = cfg_.qk_nope_head_dim + cfg_.qk_rope_head_dim;
  const DType act = ops.act_dtype();
  MR_CHECK(S * ((B + P - 1) / P + 1) <= pool.spare_pages) << S << " blocks, " << pool.spare_pages << " spare pages";
  MR_CHECK(S <= pool.max_seqs) << S << " blocks, the pool is for " << pool.max_seqs;

  // The batch, twice over: S "store" sequences whose B rows write the block's cache rows at
  // their positions, then S*B one-row "attend" sequences placed at the block's last
  // position, so that each block row attends to the context before the anchor and to the
  // whole block (the attention op is causal by position; the block is bidirectional). The
  // attend rows store the block's last row again, identically.
  ForwardBatch fb;
  std::vector<std::vector<int32_t>> page_lists(S);
  std::vector<int32_t> block_tokens(SB);
  int spare = pool.num_pages;
  for (int s = 0; s < S; ++s) {
    const DraftBlockRequest& q = requests[s];
    MR_CHECK(q.anchor_pos + B <= pool.rope.rows)
        << "a block at position " << q.anchor_pos << " is past the draft's " << pool.rope.rows << " rope rows";
    const int need = (q.anchor_pos + B + P - 1) / P;
    std::vector<int32_t>& pages = page_lists[s];
    pages.assign(q.pages.begin(), q.pages.begin() + std::min<size_t>(q.pages.size(), need));
    while (static_cast<int>(pages.size()) < need) pages.push_back(spare++);
    for (int k = 0; k < B; ++k) block_tokens[s * B + k] = k == 0 ? q.anchor_token : cfg_.mask_token_id;
    fb.add_seq(block_tokens.data() + s * B, B, q.anchor_pos, -1, pages.data(), need);
  }
  for (int s = 0; s < S; ++s)
    for (int k = 0; k < B; ++k)
      fb.add_seq(block_tokens.data() + s * B + k, 1, requests[s].anchor_pos + B - 1, -1, page_lists[s].data(),
                 static_cast<int>(page_lists[s].size()));
  fb.logit_rows.clear();
  const BatchView batch = ops.upload_batch(fb);
  phases.mark(1, sync);
  int n_slots = 0;
  for (const DraftBlockRequest& q : requests) n_slots = std::max(n_slots, std::clamp(q.n_draft, 0, B));

  // What the host reads after the pass: allocated before it, so a replayed graph (whose
  // body does not run on the host) leaves them where the captured one wrote.
  Tensor logits = ops.scratch(SB, V, DType::F32);
  // The tokens and the confidences side by side: one copy back.
  Tensor picked = ops.scratch(2 * SB, 1, DType::I32);
  Tensor tokens = picked.rows_view(0, SB);
  Tensor conf{picked.rows_view(SB, SB).data, DType::F32, SB, 1};
  const auto pass = [&] {
    ScratchScope pass_scope(ops);
    // The store rows' rope rows (the first SB positions of the batch), and each attend
    // row's stored row: its block's last.
    Tensor cs = ops.scratch(SB, cfg_.qk_rope_head_dim, DType::F32);
    ops.gather_rows(pool.rope, batch.positions, cs);
    const int32_t* last_idx = pool.last_row.as<int32_t>();

    Tensor both = ops.scratch(2 * SB, H, DType::F32);
    ops.embedding(shared.embed_tokens->w, 0, batch, both);
    Tensor h = ops.scratch(SB, H, DType::F32);
    ops.copy(both.rows_view(0, SB), h);

    Tensor xn = ops.scratch(SB, H, act), a = ops.scratch(SB, H, DType::F32);
    Tensor qa = ops.scratch(SB, cfg_.q_lora_rank, DType::F32);
    Tensor qa_n = act == DType::F32 ? qa : ops.scratch(SB, cfg_.q_lora_rank, act);
    Tensor q = ops.scratch(2 * SB, nh * qhd, DType::F32);
    Tensor ckv = ops.scratch(2 * SB, cfg_.cache_row_width(), DType::F32);
    Tensor o = ops.scratch(2 * SB, nh * cfg_.v_head_dim, DType::F32);
    Tensor o_in = act == DType::F32 ? Tensor{} : ops.scratch(SB, nh * cfg_.v_head_dim, act);
    ops.zero(q);  // the store rows' queries: attended, then dropped
    const ActivationParams swiglu{false, 0.0f, 0.0f};
    for (int i = 0; i < cfg_.num_layers; ++i) {
      const Layer& l = layers_[i];
      const KvLayer cache = layer_cache(pool, i);
      ops.rmsnorm(h, l.input_layernorm, cfg_.rms_norm_eps, xn);
      ops.linear(xn, l.attn.q_a_proj, qa);
      ops.rmsnorm(qa, l.attn.q_a_layernorm, cfg_.rms_norm_eps, qa_n);
      Tensor q_attend = q.rows_view(SB, SB);
      ops.linear(qa_n, l.attn.q_b_proj, q_attend);
      ops.rope_interleaved(q_attend, cs, nh, qhd, cfg_.qk_nope_head_dim);
      Tensor ckv_block = ckv.rows_view(0, SB);
      ops.linear(xn, l.attn.kv_a_proj_with_mqa, ckv_block);
      ops.rope_interleaved(ckv_block, cs, 1, cfg_.cache_row_width(), cfg_.kv_lora_rank);
      ops.gather_rows(ckv_block, last_idx, ckv.rows_view(SB, SB));
      ops.mla_store(ckv, l.attn.kv_a_layernorm, cfg_.rms_norm_eps, batch, cache);
      ops.mla_attention(q, l.attn.kv_b_proj, batch, cache, mla_.attn, MlaMode::kAuto, o);
      Tensor o_attend = o.rows_view(SB, SB);
      if (act != DType::F32) ops.copy(o_attend, o_in);
      ops.linear(act == DType::F32 ? o_attend : o_in, l.attn.o_proj, a);
      ops.add(h, a, h);
      ops.rmsnorm(h, l.post_attention_layernorm, cfg_.rms_norm_eps, xn);
      mlp_forward(ops, l.mlp, swiglu, xn, a);
      ops.add(h, a, h);
    }
    Tensor hn = ops.scratch(SB, H, DType::F32);
    ops.rmsnorm(h, norm, cfg_.rms_norm_eps, hn);
    Tensor hn_act = act == DType::F32 ? hn : ops.scratch(SB, H, act);
    if (act != DType::F32) ops.copy(hn, hn_act);
    ops.linear(hn_act, *shared.lm_head, logits);
    // The Markov and confidence heads, slot by slot (each slot's bias depends on the token
    // drafted before it), on the backend: only the tokens and confidences come back.
    ops.dspark_markov(logits, markov_w1_, markov_w2_, batch.token_ids, B, n_slots, hn, confidence_w_,
                      confidence_b_, tokens, conf);
  };
  // The shape of a pass is (S, n_slots); the page tables' contents and the positions are
  // device data the graph reads (upload_batch keeps the tables' addresses for a shape).
  if (capture)
    ops.run_captured(kDSparkGraphKey | static_cast<uint64_t>(n_slots) << 32 | static_cast<uint64_t>(S), pass);
  else
    pass();
  phases.mark(2, sync);
  std::vector<int32_t> host_picked(2 * SB);
  std::vector<float> host_conf(cfg_.confidence_head ? SB : 0), host_logits(want_logits ? SB * V : 0);
  ops.download(picked, host_picked.data());
  const int32_t* host_tokens = host_picked.data();
  if (cfg_.confidence_head) std::memcpy(host_conf.data(), host_picked.data() + SB, SB * sizeof(float));
  if (want_logits) ops.download(logits, host_logits.data());
  for (int s = 0; s < real; ++s) {
    DraftBlockResult& res = results[s];
    const int n = std::clamp(requests[s].n_draft, 0, B);
    for (int k = 0; k < n; ++k) {
      const int64_t row = static_cast<int64_t>(s) * B + k;
      res.tokens.push_back(host_tokens[row]);
      if (cfg_.confidence_head) res.confidence.push_back(host_conf[row]);
      if (want_logits) res.logits.insert(res.logits.end(), host_logits.begin() + row * V, host_logits.begin() + (row + 1) * V);
    }
  }
  phases.mark(3, sync);
  phases.done();
}

}  // namespace moonrun
