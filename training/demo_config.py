"""config.json of the trained K3-architecture demo model (issue #17).

Same layout as src/model/demo_model.cpp's demo_model_config (kimi_k3 top level, nested
kimi_linear text_config with quantization_config, vision_config), at the demo's sizes.
Special ids sit right after the base tokens, as in the release (K3_SPEC.md section 4).
"""

NUM_RESERVED_SPECIAL_TOKENS = 256


def demo_config(n_base_tokens, with_vision_tower=True):
    """with_vision_tower=False leaves the tower out of vision_config (no vt_* fields): the
    loader then expects no vision_tower.* / mm_projector.* tensors."""
    vocab = n_base_tokens + NUM_RESERVED_SPECIAL_TOKENS
    bos, eos, pad, media = n_base_tokens, n_base_tokens + 2, n_base_tokens + 255, n_base_tokens + 21
    quant = {
        "quant_method": "compressed-tensors",
        "format": "mxfp4-pack-quantized",
        "config_groups": {"group_0": {
            "weights": {"num_bits": 4, "group_size": 32, "type": "float", "strategy": "group"},
            "input_activations": None,
            "targets": ["Linear"]}},
        "ignore": ["re:.*shared_experts.*", "re:.*self_attn.*", "re:.*mlp\\..*", "re:.*gate$",
                   "re:.*routed_expert_(down|up)_proj", "lm_head"],
    }
    text = {
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "hidden_act": "situ",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "q_lora_rank": 128,
        "kv_lora_rank": 128,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "linear_attn_config": {
            "full_attn_layers": [4, 8],  # 1-based, as in K3
            "kda_layers": [1, 2, 3, 5, 6, 7],
            "num_heads": 4,
            "head_dim": 64,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
            "use_full_rank_gate": True,
        },
        "attn_res_block_size": 3,
        "num_experts": 16,
        "num_experts_per_token": 4,
        "num_shared_experts": 1,
        "moe_intermediate_size": 128,
        "routed_expert_hidden_size": 128,
        "latent_moe_use_norm": True,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": 2.5,
        "use_grouped_topk": True,
        "num_expert_group": 4,
        "topk_group": 2,
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "tie_word_embeddings": False,
        "quantization_config": quant,
    }
    vision = {"patch_size": 14, "merge_kernel_size": [2, 2]}
    if with_vision_tower:
        vision.update({
            "init_pos_emb_height": 16,
            "init_pos_emb_width": 16,
            "init_pos_emb_time": 4,
            "pos_emb_type": "divided_fixed",
            "vt_num_attention_heads": 2,
            "vt_num_hidden_layers": 2,
            "vt_hidden_size": 64,
            "vt_intermediate_size": 128,
            "qkv_hidden_size": 64,
            "merge_type": "sd2_tpool",
            "mm_projector_type": "patchmergerv2",
            "mm_hidden_size": 64,
            "projector_hidden_act": "gelu",
            "projector_ln_eps": 1e-5,
            "text_hidden_size": 256,
            "media_placeholder_token_id": media,
        })
    return {
        "_note": "moonrun demo model: K3 architecture, tiny, trained (issue #17)",
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "media_placeholder_token_id": media,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "text_config": text,
        "vision_config": vision,
    }


def count_base_tokens(tiktoken_model_path):
    """Number of ranks in a tiktoken.model file (one `base64 rank` line per token)."""
    with open(tiktoken_model_path, "rb") as f:
        return sum(1 for line in f if line.strip())
