#include "model/kimi_k2.h"

namespace moonrun {

void describe_kimi_k2_weights(const ModelConfig& cfg, KimiK2Weights& w, WeightSink& sink) {
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

  sink.matrix(w.embed_tokens, names.global("embed_tokens.weight"), cfg.vocab_size, H, ShardRule::vocab);
  w.layers.resize(cfg.num_hidden_layers);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
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
    sink.f32(m.router.w, names.layer(i, "mlp.gate.weight"), DType::BF16, {E, H}, E, H, ShardRule::replicated);
    m.router.out = E;
    m.router.in = H;
    vec(m.router_bias, names.layer(i, "mlp.gate.e_score_correction_bias"), E, DType::F32);
    sink.experts(m.w1, i, ExpertMatrix::w1, E, I, H);
    sink.experts(m.w2, i, ExpertMatrix::w2, E, H, I);
    sink.experts(m.w3, i, ExpertMatrix::w3, E, I, H);
    if (cfg.num_shared_experts > 0) mlp(m.shared, i, "mlp.shared_experts.", cfg.shared_intermediate_size());
  }
  vec(w.norm, names.global("norm.weight"), H);
  if (cfg.tie_word_embeddings) w.lm_head = w.embed_tokens;
  else sink.matrix(w.lm_head, cfg.lm_head_name, cfg.vocab_size, H, ShardRule::vocab);
}

}  // namespace moonrun
