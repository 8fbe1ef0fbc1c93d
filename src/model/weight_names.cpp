#include "model/weight_names.h"

namespace moonrun {

int64_t ExpectedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t ExpectedTensor::nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size_bytes(dtype); }

std::string TensorNames::expert(int layer_idx, int e, ExpertMatrix m, const std::string& part) const {
  const char* w = m == ExpertMatrix::w1 ? "w1" : m == ExpertMatrix::w2 ? "w2" : "w3";
  return layer(layer_idx, "block_sparse_moe.experts." + std::to_string(e) + "." + w + "." + part);
}

std::vector<std::string> expert_parts(ExpertQuant quant) {
  switch (quant) {
    case ExpertQuant::none: return {"weight"};
    case ExpertQuant::mxfp4_packed: return {"weight_packed", "weight_scale"};
    case ExpertQuant::mxfp4_gpt_oss: return {"weight_blocks", "weight_scales"};
  }
  return {};
}

namespace {

struct Lister {
  const ModelConfig& cfg;
  TensorNames names;
  std::vector<ExpectedTensor> out;

  void add(std::string name, std::vector<int64_t> shape, DType dtype = DType::BF16) {
    out.push_back({std::move(name), dtype, std::move(shape)});
  }
  void layer(int i, const std::string& suffix, std::vector<int64_t> shape, DType dtype = DType::BF16) {
    add(names.layer(i, suffix), std::move(shape), dtype);
  }

  void kda(int i) {
    const int64_t H = cfg.hidden_size, d = cfg.kda_head_dim, nh = cfg.kda_num_heads, P = cfg.kda_proj_dim();
    for (const char* p : {"q", "k", "v"}) {
      layer(i, std::string("self_attn.") + p + "_proj.weight", {P, H});
      layer(i, std::string("self_attn.") + p + "_conv1d.weight", {P, 1, cfg.kda_conv_kernel}, DType::F32);
    }
    // K3 stores A_log as [H]; Kimi Linear as [1, 1, H, 1] (is_alternative_shape accepts both).
    if (cfg.model_type == "kimi_linear") layer(i, "self_attn.A_log", {1, 1, nh, 1}, DType::F32);
    else layer(i, "self_attn.A_log", {nh}, DType::F32);
    layer(i, "self_attn.dt_bias", {P}, DType::F32);
    layer(i, "self_attn.f_a_proj.weight", {d, H});
    layer(i, "self_attn.f_b_proj.weight", {P, d});
    layer(i, "self_attn.b_proj.weight", {nh, H});
    if (cfg.kda_full_rank_gate) {
      layer(i, "self_attn.g_proj.weight", {P, H});
    } else {
      layer(i, "self_attn.g_a_proj.weight", {d, H});
      layer(i, "self_attn.g_b_proj.weight", {P, d});
    }
    layer(i, "self_attn.o_norm.weight", {d}, DType::F32);
    layer(i, "self_attn.o_proj.weight", {H, P});
  }

  void mla(int i) {
    const int64_t H = cfg.hidden_size, nh = cfg.num_attention_heads;
    const int64_t qhd = cfg.mla_q_head_dim();
    if (cfg.q_lora_rank > 0) {
      layer(i, "self_attn.q_a_proj.weight", {cfg.q_lora_rank, H});
      layer(i, "self_attn.q_a_layernorm.weight", {cfg.q_lora_rank});
      layer(i, "self_attn.q_b_proj.weight", {nh * qhd, cfg.q_lora_rank});
    } else {
      layer(i, "self_attn.q_proj.weight", {nh * qhd, H});
    }
    layer(i, "self_attn.kv_a_proj_with_mqa.weight", {cfg.mla_cache_row(), H});
    layer(i, "self_attn.kv_a_layernorm.weight", {cfg.kv_lora_rank});
    layer(i, "self_attn.kv_b_proj.weight", {nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank});
    layer(i, "self_attn.o_proj.weight", {H, nh * cfg.v_head_dim});
    if (cfg.mla_use_output_gate) layer(i, "self_attn.g_proj.weight", {nh * cfg.v_head_dim, H});
  }

  void dense_mlp(int i, const std::string& prefix, int64_t inter) {
    const int64_t H = cfg.hidden_size;
    layer(i, prefix + "gate_proj.weight", {inter, H});
    layer(i, prefix + "up_proj.weight", {inter, H});
    layer(i, prefix + "down_proj.weight", {H, inter});
  }

  // One routed-expert matrix [out, in] in the checkpoint's storage.
  void expert_matrix(int i, int e, ExpertMatrix m, int64_t out_dim, int64_t in_dim) {
    switch (cfg.expert_quant) {
      case ExpertQuant::none:
        add(names.expert(i, e, m, "weight"), {out_dim, in_dim});
        break;
      case ExpertQuant::mxfp4_packed:
        add(names.expert(i, e, m, "weight_packed"), {out_dim, in_dim / 2}, DType::U8);
        add(names.expert(i, e, m, "weight_scale"), {out_dim, in_dim / 32}, DType::U8);
        break;
      case ExpertQuant::mxfp4_gpt_oss:
        add(names.expert(i, e, m, "weight_blocks"), {out_dim, in_dim / 32, 16}, DType::U8);
        add(names.expert(i, e, m, "weight_scales"), {out_dim, in_dim / 32}, DType::U8);
        break;
    }
  }

  void moe(int i) {
    const int64_t H = cfg.hidden_size, E = cfg.num_experts, D = cfg.expert_io_dim(), I = cfg.moe_intermediate_size;
    layer(i, "block_sparse_moe.gate.weight", {E, H});
    layer(i, "block_sparse_moe.gate.e_score_correction_bias", {E}, DType::F32);
    for (int e = 0; e < E; ++e) {
      expert_matrix(i, e, ExpertMatrix::w1, I, D);
      expert_matrix(i, e, ExpertMatrix::w2, D, I);
      expert_matrix(i, e, ExpertMatrix::w3, I, D);
    }
    if (cfg.num_shared_experts > 0) dense_mlp(i, "block_sparse_moe.shared_experts.", cfg.shared_intermediate_size());
    if (cfg.routed_expert_hidden_size > 0) {
      layer(i, "block_sparse_moe.routed_expert_down_proj.weight", {D, H});
      layer(i, "block_sparse_moe.routed_expert_up_proj.weight", {H, D});
      if (cfg.latent_moe_use_norm) layer(i, "block_sparse_moe.routed_expert_norm.weight", {D});
    }
  }
};

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg) {
  Lister l{cfg, TensorNames(cfg), {}};
  const int64_t H = cfg.hidden_size;
  l.add(l.names.global("embed_tokens.weight"), {cfg.vocab_size, H});
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    l.layer(i, "input_layernorm.weight", {H});
    l.layer(i, "post_attention_layernorm.weight", {H});
    if (cfg.attn_res_block_size > 0) {
      l.layer(i, "self_attention_res_norm.weight", {H});
      l.layer(i, "self_attention_res_proj.weight", {1, H});
      l.layer(i, "mlp_res_norm.weight", {H});
      l.layer(i, "mlp_res_proj.weight", {1, H});
    }
    if (cfg.layers[i].attn == LayerKind::kda) l.kda(i);
    else l.mla(i);
    if (cfg.layers[i].mlp == MlpKind::dense) l.dense_mlp(i, "mlp.", cfg.intermediate_size);
    else l.moe(i);
  }
  l.add(l.names.global("norm.weight"), {H});
  if (cfg.attn_res_block_size > 0) {
    l.add(l.names.global("output_attn_res_norm.weight"), {H});
    l.add(l.names.global("output_attn_res_proj.weight"), {1, H});
  }
  if (!cfg.tie_word_embeddings) l.add(cfg.lm_head_name, {cfg.vocab_size, H});
  return std::move(l.out);
}

bool is_alternative_shape(const ExpectedTensor& t, const std::vector<int64_t>& stored) {
  const std::string suffix = ".A_log";
  if (t.name.size() < suffix.size() || t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  int64_t n = 1, non_unit = 0;
  for (int64_t d : stored) {
    n *= d;
    if (d != 1) ++non_unit;
  }
  return n == t.numel() && non_unit <= 1;
}

}  // namespace moonrun
