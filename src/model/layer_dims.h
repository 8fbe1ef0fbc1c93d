#pragma once
// The per-layer dimensions the layers take, derived once from ModelConfig.
#include <cmath>

#include "model/config.h"
#include "model/layers/kda.h"
#include "model/layers/mla.h"
#include "model/layers/moe.h"

namespace moonrun {

inline KdaShape kda_shape(const ModelConfig& c) {
  KdaShape d;
  d.hidden = c.hidden_size;
  d.num_heads = c.kda_num_heads;
  d.head_dim = c.kda_head_dim;
  d.conv_kernel = c.kda_conv_kernel;
  d.norm_eps = c.rms_norm_eps;
  d.gate_lower_bound = c.kda_has_lower_bound ? c.kda_gate_lower_bound : NAN;
  return d;
}

inline MlaDims mla_dims(const ModelConfig& c) {
  MlaDims d;
  d.hidden = c.hidden_size;
  d.q_lora_rank = c.q_lora_rank;
  d.attn.num_heads = c.num_attention_heads;
  d.attn.kv_lora = c.kv_lora_rank;
  d.attn.nope = c.qk_nope_head_dim;
  d.attn.rope = c.qk_rope_head_dim;
  d.attn.v_dim = c.v_head_dim;
  d.output_gate = c.mla_use_output_gate;
  d.q_a_norm_eps = 1e-6f;  // KimiRMSNorm's default: the MLA norms do not take rms_norm_eps
  d.kv_a_norm_eps = 1e-6f;
  return d;
}

inline ActivationParams activation_params(const ModelConfig& c) {
  return ActivationParams{c.hidden_act == Activation::situ, c.situ_beta, c.situ_linear_beta};
}

inline MoeDims moe_dims(const ModelConfig& c) {
  MoeDims d;
  d.hidden = c.hidden_size;
  d.io_dim = c.expert_io_dim();
  d.router = RouterParams{c.num_experts, c.num_experts_per_token, c.num_expert_group, c.topk_group,
                          c.moe_renormalize, c.routed_scaling_factor};
  d.act = activation_params(c);
  d.norm_eps = c.rms_norm_eps;
  return d;
}

}  // namespace moonrun
