#pragma once
// ModelConfig: the typed, validated form of a checkpoint's config.json (K3_SPEC.md §1–2).
// Which family a config.json belongs to is decided once, by the family table
// (model/families.h): `kimi_k3` (the text model under "text_config", special token ids at
// the top level), `kimi_linear` (everything at the top level) and the K2 generation's
// DeepSeek-V3 layout (`kimi_k2` flat, `kimi_k25` under "text_config"), and K3.1 (`kimi_k31`:
// K3's layout plus a "dsa_config" naming the layers whose MLA carries a DSA indexer). Parsed once; every
// other part of moonrun reads these fields, never the JSON.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/vision/vision_config.h"

namespace moonrun {

// The model families moonrun knows (one row each in model/families.cpp).
enum class Family { kimi_k3, kimi_linear, kimi_k2, kimi_k31 };
const char* family_name(Family f);  // "kimi_k3", "kimi_linear", "kimi_k2", "kimi_k31"

enum class LayerKind { kda, mla };
enum class MlpKind { dense, moe };

// How the routed experts are stored in the checkpoint.
enum class ExpertQuant {
  none,              // bf16 w1/w2/w3 `.weight` (Kimi Linear, test checkpoints)
  mxfp4_packed,      // compressed-tensors "mxfp4-pack-quantized": weight_packed/weight_scale
  mxfp4_gpt_oss,     // gpt-oss style ("quant_method": "mxfp4"): weight_blocks/weight_scales
  // compressed-tensors "pack-quantized", int4 symmetric in groups of 32 (the K2 family's
  // routed experts): weight_packed int32 [out, in/8] (value i of a word at bits 4i..4i+3,
  // stored as q + 8), weight_scale bf16 [out, in/32], weight_shape int64 [2].
  int4_g32_sym,
};
const char* expert_quant_name(ExpertQuant q);

enum class Activation { situ, silu };

// YaRN RoPE scaling (config.json "rope_scaling" with type/rope_type "yarn"), as
// transformers' _compute_yarn_parameters and DeepSeek-V3's softmax scale read it.
struct RopeScaling {
  bool yarn = false;  // false: plain RoPE (no rope_scaling)
  float factor = 1.0f;
  int original_max_position_embeddings = 0;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float mscale = 1.0f;
  float mscale_all_dim = 0.0f;
};

// What only the K2 family (DeepSeek-V3 layout) has: rotary embeddings on the MLA rope dims
// with YaRN scaling, and DeepSeek's noaux_tc router (sigmoid scores + e_score_correction_bias,
// grouped top-k, norm_topk_prob, routed_scaling_factor). Other fields it shares with K3 (MLA
// widths, experts, groups) live in ModelConfig itself and mean the same thing there.
struct KimiK2Part {
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  std::string topk_method = "noaux_tc";
  std::string scoring_func = "sigmoid";
  bool norm_topk_prob = true;
  bool vision_tower = false;  // kimi_k25: a vision_config is present (the tower: ModelConfig::vision)
};

// What only K3.1 (Family::kimi_k31) has: DeepSeek Sparse Attention in the full-attention
// layers (issue 38). Each DSA layer keeps K3's gated MLA and adds a lightning indexer:
// q_I = wq_b(q latent) [n_heads x head_dim], one key k_I = LayerNorm(wk(x)) [head_dim] per
// token (no RoPE), per-head weights weights_proj(x) [n_heads]; score I[t, s] =
// sum_h w[t, h] ReLU(q_I[t, h] . k_I[s]); each query attends to its top `topk` keys. The
// indexer keys are cached per token beside the latent rows, FP8 with one fp32 scale per
// 128 values (DeepSeek-V3.2's indexer cache).
struct DsaPart {
  int index_n_heads = 0;    // 32 in K3.1-Pro
  int index_head_dim = 0;   // 128
  int index_topk = 0;       // 2048
  float k_norm_eps = 1e-6f; // the key LayerNorm's eps: rms_norm_eps (the config declares none)
  std::vector<int> layers;  // dsa_config's layers, 1-based as written (= the full-attention layers)
  // Bytes one token's indexer key takes in the cache of one DSA layer: head_dim FP8 values
  // + one fp32 scale per 128 of them (128 + 4 = 132 in K3.1-Pro).
  int64_t key_cache_bytes() const { return index_head_dim + 4 * ((index_head_dim + 127) / 128); }
};

struct LayerSpec {
  LayerKind attn = LayerKind::kda;
  MlpKind mlp = MlpKind::dense;
  int kda_index = -1;  // index among the KDA layers (cache slot layer), -1 for MLA
  int mla_index = -1;  // index among the MLA layers (page pool layer), -1 for KDA
  int dsa_index = -1;  // index among the DSA layers (K3.1: an MLA layer with an indexer), else -1
};

struct ModelConfig {
  Family family = Family::kimi_k3;
  std::string model_type;    // the top level's: "kimi_k3", "kimi_linear", "kimi_k2", "kimi_k25"
  std::string architecture;  // config.json "architectures"[0] ("" when absent)
  // Where the text model's tensors live: "language_model.model." (K3, K2.5) or "model."
  // (Kimi Linear, K2).
  std::string tensor_prefix;
  std::string lm_head_name;  // "language_model.lm_head.weight" / "lm_head.weight"

  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;  // dense MLP (layers < first_k_dense_replace)
  int num_hidden_layers = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  int max_position_embeddings = 0;

  // Special tokens (K3: top level; Kimi Linear: text config). -1 when absent.
  int bos_token_id = -1;
  int eos_token_id = -1;
  int pad_token_id = -1;
  int media_placeholder_token_id = -1;

  Activation hidden_act = Activation::silu;
  float situ_beta = 1.0f;         // activation_situ_beta
  float situ_linear_beta = 0.0f;  // activation_situ_linear_beta; 0: up passes through

  // MLA (full attention) layers.
  int num_attention_heads = 0;
  int q_lora_rank = 0;  // 0: null in config.json (q_proj instead of q_a/q_b)
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool mla_use_output_gate = false;

  // KDA (linear attention) layers.
  int kda_num_heads = 0;
  int kda_head_dim = 0;
  int kda_conv_kernel = 4;
  bool kda_has_lower_bound = false;
  float kda_gate_lower_bound = 0.0f;  // -5 in K3 (safe gate)
  bool kda_full_rank_gate = false;    // g_proj (K3) vs g_a_proj/g_b_proj (Kimi Linear)

  // Attention Residuals; 0 = plain residual stream.
  int attn_res_block_size = 0;

  // MoE.
  int num_experts = 0;  // 0: no MoE layers
  int num_experts_per_token = 0;
  int num_shared_experts = 0;
  int moe_intermediate_size = 0;
  int routed_expert_hidden_size = 0;  // LatentMoE width; 0: experts run at hidden_size
  bool latent_moe_use_norm = false;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  bool moe_renormalize = true;
  float routed_scaling_factor = 1.0f;
  int num_expert_group = 1;
  int topk_group = 1;
  ExpertQuant expert_quant = ExpertQuant::none;

  // kimi_k3 / kimi_k25: the MoonViT tower and projector (vision.enabled false: text only).
  VisionConfig vision;

  // Family::kimi_k2 only.
  KimiK2Part k2;

  // Family::kimi_k31 only (num_dsa_layers 0 elsewhere).
  DsaPart dsa;

  std::vector<LayerSpec> layers;  // [num_hidden_layers]
  int num_kda_layers = 0;
  int num_mla_layers = 0;
  int num_dsa_layers = 0;  // MLA layers with a DSA indexer (K3.1)

  // Derived widths.
  int kda_proj_dim() const { return kda_num_heads * kda_head_dim; }
  int mla_q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int mla_cache_row() const { return kv_lora_rank + qk_rope_head_dim; }
  // Query-key pairs of attention work a cached position costs a prefill chunk after it in
  // plain-order MLA, whatever the chunk's length: kv_b's expansion of its latent (kv_lora x
  // (nope + v) a head) over a pair's (nope + rope + v) a head. 409.6 for K3 and K2; 0 without
  // MLA, and with DSA (its chunks read selected latents, not the whole prefix). The
  // prefill pacer's (engine/prefill_pacer.h).
  double prefill_context_pairs() const {
    const int pair = qk_nope_head_dim + qk_rope_head_dim + v_head_dim;
    if (kv_lora_rank <= 0 || pair <= 0 || dsa.index_topk > 0) return 0;
    return static_cast<double>(kv_lora_rank) * (qk_nope_head_dim + v_head_dim) / pair;
  }
  // Width the routed experts work in (LatentMoE) and the shared MLP's intermediate width.
  int expert_io_dim() const { return routed_expert_hidden_size > 0 ? routed_expert_hidden_size : hidden_size; }
  int shared_intermediate_size() const { return moe_intermediate_size * num_shared_experts; }
};

// Parses and validates: the family table (model/families.h) picks the family from
// "architectures"[0] / model_type and runs its parser. `source` names the file in messages
// ("DIR/config.json").
Result<ModelConfig> parse_model_config(const nlohmann::json& config, const std::string& source);

// The families' parsers (the table's "parse config" column): each fills `cfg` from the
// whole config.json document.
Status parse_kimi_k3_config(const nlohmann::json& config, const std::string& source, ModelConfig& cfg);
Status parse_kimi_linear_config(const nlohmann::json& config, const std::string& source, ModelConfig& cfg);
Status parse_kimi_k2_config(const nlohmann::json& config, const std::string& source, ModelConfig& cfg);
// K3.1: K3's config (text_config as K3's) plus text_config.dsa_config (model/kimi_k31.h).
Status parse_kimi_k31_config(const nlohmann::json& config, const std::string& source, ModelConfig& cfg);
// Reads DIR/config.json (or the path itself when it names a file) and parses it.
Result<ModelConfig> load_model_config(const std::string& path);

}  // namespace moonrun
