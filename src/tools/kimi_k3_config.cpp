// Generated from shared/models/kimi-k3.config.json; keep byte-identical (tests/unit/tools).
#include "tools/kimi_k3_config.h"

namespace moonrun::tools {

std::string_view kimi_k3_config_json() {
  static constexpr std::string_view kJson = R"json({
 "_provenance": "Kimi K3 config.json as published (text_config from third-party copies of the real file; vision_config fields beyond patch_size/merge are not confirmed). Data for planning and for full-width benchmark slices.",
 "architectures": [
  "KimiK3ForConditionalGeneration"
 ],
 "model_type": "kimi_k3",
 "bos_token_id": 163584,
 "eos_token_id": 163586,
 "pad_token_id": 163839,
 "media_placeholder_token_id": 163605,
 "tie_word_embeddings": false,
 "text_config": {
  "model_type": "kimi_linear",
  "architectures": [
   "KimiLinearForCausalLM"
  ],
  "vocab_size": 163840,
  "hidden_size": 7168,
  "intermediate_size": 33792,
  "num_hidden_layers": 93,
  "num_attention_heads": 96,
  "num_key_value_heads": 96,
  "hidden_act": "situ",
  "activation_situ_beta": 4.0,
  "activation_situ_linear_beta": 25.0,
  "rms_norm_eps": 1e-05,
  "max_position_embeddings": 1048576,
  "q_lora_rank": 1536,
  "kv_lora_rank": 512,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "v_head_dim": 128,
  "mla_use_nope": true,
  "mla_use_output_gate": true,
  "linear_attn_config": {
   "full_attn_layers": [
    4,
    8,
    12,
    16,
    20,
    24,
    28,
    32,
    36,
    40,
    44,
    48,
    52,
    56,
    60,
    64,
    68,
    72,
    76,
    80,
    84,
    88,
    92,
    93
   ],
   "kda_layers": [
    1,
    2,
    3,
    5,
    6,
    7,
    9,
    10,
    11,
    13,
    14,
    15,
    17,
    18,
    19,
    21,
    22,
    23,
    25,
    26,
    27,
    29,
    30,
    31,
    33,
    34,
    35,
    37,
    38,
    39,
    41,
    42,
    43,
    45,
    46,
    47,
    49,
    50,
    51,
    53,
    54,
    55,
    57,
    58,
    59,
    61,
    62,
    63,
    65,
    66,
    67,
    69,
    70,
    71,
    73,
    74,
    75,
    77,
    78,
    79,
    81,
    82,
    83,
    85,
    86,
    87,
    89,
    90,
    91
   ],
   "num_heads": 96,
   "head_dim": 128,
   "short_conv_kernel_size": 4,
   "gate_lower_bound": -5.0,
   "use_full_rank_gate": true
  },
  "attn_res_block_size": 12,
  "num_experts": 896,
  "num_experts_per_token": 16,
  "num_shared_experts": 2,
  "moe_intermediate_size": 3072,
  "routed_expert_hidden_size": 3584,
  "latent_moe_use_norm": true,
  "first_k_dense_replace": 1,
  "moe_layer_freq": 1,
  "moe_renormalize": true,
  "moe_router_activation_func": "sigmoid",
  "routed_scaling_factor": 1.0,
  "use_grouped_topk": true,
  "num_expert_group": 1,
  "topk_group": 1,
  "topk_method": "noaux_tc",
  "num_nextn_predict_layers": 0,
  "bos_token_id": 163584,
  "eos_token_id": 163586,
  "pad_token_id": 163839,
  "tie_word_embeddings": false,
  "quantization_config": {
   "quant_method": "compressed-tensors",
   "format": "mxfp4-pack-quantized",
   "config_groups": {
    "group_0": {
     "weights": {
      "num_bits": 4,
      "group_size": 32,
      "type": "float",
      "strategy": "group"
     },
     "input_activations": null,
     "targets": [
      "Linear"
     ]
    }
   },
   "ignore": [
    "re:.*shared_experts.*",
    "re:.*self_attn.*",
    "re:.*mlp\\..*",
    "re:.*gate$",
    "re:.*routed_expert_(down|up)_proj",
    "lm_head"
   ]
  }
 },
 "vision_config": {
  "patch_size": 14,
  "merge_kernel_size": [
   2,
   2
  ],
  "_note": "MoonViT-V2 (3d patch embed, 2D RoPE); take the rest from the checkpoint"
 }
}
)json";
  return kJson;
}

}  // namespace moonrun::tools
