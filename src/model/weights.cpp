#include "model/weights.h"

#include <cstring>
#include <map>

#include "common/dtype.h"
#include "kernels/cpu/mxfp4.h"
#include "model/weight_names.h"

namespace moonrun {

namespace {

bool is_float_dtype(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

class Loader {
 public:
  Loader(const Checkpoint& ckpt, const ModelConfig& cfg) : ckpt_(ckpt), cfg_(cfg), names_(cfg) {
    for (auto& t : expected_tensors(cfg)) expected_.emplace(t.name, std::move(t));
  }
  const TensorNames& names() const { return names_; }

  // The tensor as the name table describes it. Float tensors may be stored in any float
  // dtype (test checkpoints keep fp32 everywhere); integer tensors must match exactly.
  Result<const TensorInfo*> tensor(const std::string& name) {
    auto it = expected_.find(name);
    MR_CHECK(it != expected_.end()) << "tensor " << name << " is not in the name table";
    const ExpectedTensor& want = it->second;
    const TensorInfo* stored = MR_TRY(ckpt_.get(name));
    DType dtype = want.dtype;
    if (is_float_dtype(want.dtype) && is_float_dtype(stored->dtype)) dtype = stored->dtype;
    std::vector<int64_t> shape = want.shape;
    if (stored->shape != shape && is_alternative_shape(want, stored->shape)) shape = stored->shape;
    return ckpt_.get(name, dtype, shape);
  }

  Result<std::vector<float>> floats(const std::string& name) {
    const TensorInfo* t = MR_TRY(tensor(name));
    const int64_t n = t->numel();
    std::vector<float> out(static_cast<size_t>(n));
    const uint8_t* p = t->data;
    switch (t->dtype) {
      case DType::F32:
        std::memcpy(out.data(), p, static_cast<size_t>(n) * 4);
        break;
      case DType::BF16:
        for (int64_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          out[i] = bf16_to_f32(h);
        }
        break;
      case DType::F16:
        for (int64_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          out[i] = f16_to_f32(h);
        }
        break;
      default:
        MR_CHECK(false) << "unreachable: " << name << " is not a float tensor";
    }
    return out;
  }

  Result<cpu::Linear> linear(const std::string& name) {
    const TensorInfo* t = MR_TRY(tensor(name));
    cpu::Linear l;
    l.out_features = static_cast<int>(t->shape[0]);
    l.in_features = static_cast<int>(t->shape[1]);
    l.w = MR_TRY(floats(name));
    return l;
  }

  // One routed-expert matrix [out, in], dequantised when MXFP4.
  Result<cpu::Linear> expert(int layer, int e, ExpertMatrix m) {
    if (cfg_.expert_quant == ExpertQuant::none) return linear(names_.expert(layer, e, m, "weight"));
    const auto parts = expert_parts(cfg_.expert_quant);
    const TensorInfo* codes = MR_TRY(tensor(names_.expert(layer, e, m, parts[0])));
    const TensorInfo* scales = MR_TRY(tensor(names_.expert(layer, e, m, parts[1])));
    cpu::Linear l;
    l.out_features = static_cast<int>(codes->shape[0]);
    l.in_features = static_cast<int>(scales->shape[1]) * 32;
    l.w.resize(static_cast<size_t>(l.out_features) * l.in_features);
    cpu::dequantize_mxfp4(codes->data, scales->data, l.out_features, l.in_features, l.w.data());
    return l;
  }

  // The same matrix, still packed (MXFP4 checkpoints only).
  Result<cpu::Mxfp4Matrix> packed_expert(int layer, int e, ExpertMatrix m) {
    MR_CHECK(cfg_.expert_quant != ExpertQuant::none) << "packed_expert on a checkpoint without MXFP4 experts";
    const auto parts = expert_parts(cfg_.expert_quant);
    const TensorInfo* codes = MR_TRY(tensor(names_.expert(layer, e, m, parts[0])));
    const TensorInfo* scales = MR_TRY(tensor(names_.expert(layer, e, m, parts[1])));
    cpu::Mxfp4Matrix p;
    p.out_features = static_cast<int>(codes->shape[0]);
    p.in_features = static_cast<int>(scales->shape[1]) * 32;
    p.codes.assign(codes->data, codes->data + static_cast<size_t>(p.out_features) * p.in_features / 2);
    p.scales.assign(scales->data, scales->data + static_cast<size_t>(p.out_features) * p.in_features / 32);
    return p;
  }

 private:
  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  TensorNames names_;
  std::map<std::string, ExpectedTensor> expected_;
};

Status load_kda(Loader& ld, const ModelConfig& cfg, int i, cpu::KdaWeights& w) {
  const auto& n = ld.names();
  auto attn = [&](const std::string& s) { return n.layer(i, "self_attn." + s); };
  w.q_proj = MR_TRY(ld.linear(attn("q_proj.weight")));
  w.k_proj = MR_TRY(ld.linear(attn("k_proj.weight")));
  w.v_proj = MR_TRY(ld.linear(attn("v_proj.weight")));
  w.q_conv = MR_TRY(ld.floats(attn("q_conv1d.weight")));  // [D, 1, K] -> [D, K]
  w.k_conv = MR_TRY(ld.floats(attn("k_conv1d.weight")));
  w.v_conv = MR_TRY(ld.floats(attn("v_conv1d.weight")));
  w.A_log = MR_TRY(ld.floats(attn("A_log")));
  w.dt_bias = MR_TRY(ld.floats(attn("dt_bias")));
  w.f_a_proj = MR_TRY(ld.linear(attn("f_a_proj.weight")));
  w.f_b_proj = MR_TRY(ld.linear(attn("f_b_proj.weight")));
  w.b_proj = MR_TRY(ld.linear(attn("b_proj.weight")));
  if (cfg.kda_full_rank_gate) {
    w.g_proj = MR_TRY(ld.linear(attn("g_proj.weight")));
  } else {
    w.g_a_proj = MR_TRY(ld.linear(attn("g_a_proj.weight")));
    w.g_b_proj = MR_TRY(ld.linear(attn("g_b_proj.weight")));
  }
  w.o_norm = MR_TRY(ld.floats(attn("o_norm.weight")));
  w.o_proj = MR_TRY(ld.linear(attn("o_proj.weight")));
  return Status::ok();
}

Status load_mla(Loader& ld, const ModelConfig& cfg, int i, cpu::MlaWeights& w) {
  const auto& n = ld.names();
  auto attn = [&](const std::string& s) { return n.layer(i, "self_attn." + s); };
  if (cfg.q_lora_rank > 0) {
    w.q_a_proj = MR_TRY(ld.linear(attn("q_a_proj.weight")));
    w.q_a_layernorm = MR_TRY(ld.floats(attn("q_a_layernorm.weight")));
    w.q_b_proj = MR_TRY(ld.linear(attn("q_b_proj.weight")));
  } else {
    w.q_proj = MR_TRY(ld.linear(attn("q_proj.weight")));
  }
  w.kv_a_proj_with_mqa = MR_TRY(ld.linear(attn("kv_a_proj_with_mqa.weight")));
  w.kv_a_layernorm = MR_TRY(ld.floats(attn("kv_a_layernorm.weight")));
  w.kv_b_proj = MR_TRY(ld.linear(attn("kv_b_proj.weight")));
  w.o_proj = MR_TRY(ld.linear(attn("o_proj.weight")));
  if (cfg.mla_use_output_gate) w.g_proj = MR_TRY(ld.linear(attn("g_proj.weight")));
  return Status::ok();
}

Status load_mlp(Loader& ld, int i, const std::string& prefix, cpu::MlpWeights& w) {
  const auto& n = ld.names();
  w.gate = MR_TRY(ld.linear(n.layer(i, prefix + "gate_proj.weight")));
  w.up = MR_TRY(ld.linear(n.layer(i, prefix + "up_proj.weight")));
  w.down = MR_TRY(ld.linear(n.layer(i, prefix + "down_proj.weight")));
  return Status::ok();
}

Status load_moe(Loader& ld, const ModelConfig& cfg, const WeightLoadOptions& opt, int i, cpu::MoeWeights& w) {
  const auto& n = ld.names();
  w.router = MR_TRY(ld.linear(n.layer(i, "block_sparse_moe.gate.weight")));
  w.router_bias = MR_TRY(ld.floats(n.layer(i, "block_sparse_moe.gate.e_score_correction_bias")));
  if (opt.mxfp4_packed && cfg.expert_quant != ExpertQuant::none) {
    w.packed_experts.resize(cfg.num_experts);
    for (int e = 0; e < cfg.num_experts; ++e) {
      w.packed_experts[e].gate = MR_TRY(ld.packed_expert(i, e, ExpertMatrix::w1));
      w.packed_experts[e].down = MR_TRY(ld.packed_expert(i, e, ExpertMatrix::w2));
      w.packed_experts[e].up = MR_TRY(ld.packed_expert(i, e, ExpertMatrix::w3));
    }
  } else {
    w.experts.resize(cfg.num_experts);
  }
  for (int e = 0; e < static_cast<int>(w.experts.size()); ++e) {
    w.experts[e].gate = MR_TRY(ld.expert(i, e, ExpertMatrix::w1));
    w.experts[e].down = MR_TRY(ld.expert(i, e, ExpertMatrix::w2));
    w.experts[e].up = MR_TRY(ld.expert(i, e, ExpertMatrix::w3));
  }
  if (cfg.num_shared_experts > 0) MR_RETURN_IF_ERROR(load_mlp(ld, i, "block_sparse_moe.shared_experts.", w.shared));
  if (cfg.routed_expert_hidden_size > 0) {
    w.latent_down = MR_TRY(ld.linear(n.layer(i, "block_sparse_moe.routed_expert_down_proj.weight")));
    w.latent_up = MR_TRY(ld.linear(n.layer(i, "block_sparse_moe.routed_expert_up_proj.weight")));
    if (cfg.latent_moe_use_norm)
      w.latent_norm = MR_TRY(ld.floats(n.layer(i, "block_sparse_moe.routed_expert_norm.weight")));
  }
  return Status::ok();
}

}  // namespace

Result<ModelWeights> load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const WeightLoadOptions& options) {
  Loader ld(ckpt, cfg);
  const auto& n = ld.names();
  ModelWeights mw;
  mw.embed_tokens = MR_TRY(ld.floats(n.global("embed_tokens.weight")));
  mw.layers.resize(cfg.num_hidden_layers);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    LayerWeights& lw = mw.layers[i];
    lw.input_layernorm = MR_TRY(ld.floats(n.layer(i, "input_layernorm.weight")));
    lw.post_attention_layernorm = MR_TRY(ld.floats(n.layer(i, "post_attention_layernorm.weight")));
    if (cfg.attn_res_block_size > 0) {
      lw.attn_res_norm = MR_TRY(ld.floats(n.layer(i, "self_attention_res_norm.weight")));
      lw.attn_res_proj = MR_TRY(ld.floats(n.layer(i, "self_attention_res_proj.weight")));
      lw.mlp_res_norm = MR_TRY(ld.floats(n.layer(i, "mlp_res_norm.weight")));
      lw.mlp_res_proj = MR_TRY(ld.floats(n.layer(i, "mlp_res_proj.weight")));
    }
    if (cfg.layers[i].attn == LayerKind::kda) MR_RETURN_IF_ERROR(load_kda(ld, cfg, i, lw.kda));
    else MR_RETURN_IF_ERROR(load_mla(ld, cfg, i, lw.mla));
    if (cfg.layers[i].mlp == MlpKind::dense) MR_RETURN_IF_ERROR(load_mlp(ld, i, "mlp.", lw.mlp));
    else MR_RETURN_IF_ERROR(load_moe(ld, cfg, options, i, lw.moe));
  }
  mw.norm = MR_TRY(ld.floats(n.global("norm.weight")));
  if (cfg.attn_res_block_size > 0) {
    mw.output_attn_res_norm = MR_TRY(ld.floats(n.global("output_attn_res_norm.weight")));
    mw.output_attn_res_proj = MR_TRY(ld.floats(n.global("output_attn_res_proj.weight")));
  }
  if (cfg.tie_word_embeddings) {
    mw.lm_head.w = mw.embed_tokens;
    mw.lm_head.out_features = cfg.vocab_size;
    mw.lm_head.in_features = cfg.hidden_size;
  } else {
    mw.lm_head = MR_TRY(ld.linear(n.lm_head()));
  }
  return mw;
}

}  // namespace moonrun
