#pragma once
// What `moonrun plan` needs to know about a model: the handful of config.json fields that
// fix its memory (layer kinds, head counts, widths, experts) and its weight bytes split by
// how they shard across GPUs. Weight bytes come either from a checkpoint's safetensors
// headers (exact: the bytes on disk) or from config.json alone (computed tensor by tensor
// from the MXFP4/bf16 layout of K3_SPEC.md sections 1-3).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/config.h"
#include "model/weight_spec.h"

namespace moonrun::tools {

// The config fields plan reads, taken from the typed ModelConfig (model/config.h), which
// reads both layouts: K3's nested `text_config` and Kimi Linear's flat config.json.
struct PlanModelShape {
  ModelConfig config;            // the parsed config (expected_tensors lists its weights)
  std::string name;              // "kimi-k3", or the directory / file given
  int64_t hidden = 0;            // hidden_size
  int64_t n_layers = 0;          // num_hidden_layers
  int64_t vocab = 0;             // vocab_size
  int64_t n_heads = 0;           // num_attention_heads (MLA)
  int64_t n_mla_layers = 0;      // full-attention layers: they keep a KV cache per token
  int64_t n_kda_layers = 0;      // KDA layers: fixed recurrent state per sequence
  int64_t kda_heads = 0;         // linear_attn_config.num_heads
  int64_t kda_head_dim = 0;      // linear_attn_config.head_dim
  int64_t kda_conv_kernel = 0;   // short_conv_kernel_size
  bool kda_full_rank_gate = false;
  int64_t q_lora_rank = 0;       // 0 = plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool mla_output_gate = false;
  int64_t n_dsa_layers = 0;            // K3.1: MLA layers with a DSA indexer (its keys cached too)
  int64_t dsa_key_bytes = 0;           // one token's indexer key in one DSA layer: FP8 + fp32 scale
  int64_t dense_intermediate = 0;      // intermediate_size (layers before first_k_dense_replace)
  int64_t first_k_dense = 0;           // first_k_dense_replace
  int64_t n_experts = 0;               // num_experts (routed)
  int64_t n_experts_per_token = 0;
  int64_t n_shared_experts = 0;
  int64_t moe_intermediate = 0;        // expert FFN width
  int64_t latent_moe_hidden = 0;       // routed_expert_hidden_size (0 = experts run at hidden)
  bool experts_mxfp4 = false;          // quantization_config: mxfp4-pack-quantized experts
  bool tie_word_embeddings = false;
  bool has_vision = false;             // vision_config present
  nlohmann::json vision_config;        // as given (sizes the vision tower estimate)
  int64_t max_context = 0;             // max_position_embeddings

  int64_t n_moe_layers() const { return n_layers - first_k_dense; }
};

// Builds the shape from a config.json document; errors name `source` and the field.
Result<PlanModelShape> plan_shape_from_config(const nlohmann::json& config,
                                              const std::string& source);

// How a group of weights is laid out over TP x EP ranks.
enum class Shard { kTensorParallel, kExpertParallel, kReplicated };
const char* shard_name(Shard s);

// One row of the weight table: a family of tensors with the same role.
struct WeightGroup {
  std::string name;     // "routed experts (MXFP4)", "KDA projections", ...
  Shard shard;
  uint64_t bytes = 0;   // over the whole model
  uint64_t n_tensors = 0;
  bool estimated = false;  // true when a field the config lacks was taken from defaults
};

struct WeightBytes {
  std::vector<WeightGroup> groups;
  uint64_t file_overhead_bytes = 0;  // safetensors headers (exact from files, else estimated)
  bool exact = false;                // true when read from a checkpoint's files
  std::string note;                  // how the figure was obtained, for the report
  uint64_t total_bytes() const;      // groups + file overhead = what the download weighs
  uint64_t bytes_of(Shard s) const;
};

// Computed from config.json alone: every text tensor from weight_spec() (the one name
// table: MXFP4 experts as packed u8 [out, in/2] + E8M0 scale u8 [out, in/32], fp32 where the
// release is fp32, bf16 elsewhere), plus the safetensors headers those names imply. The
// vision tower's config in the published file has only patch_size and merge_kernel_size, so
// its size is estimated from the reference defaults (MoonViT: 27 layers, width 1024) and
// marked as an estimate.
WeightBytes weight_bytes_from_config(const PlanModelShape& shape);

// Exact: the safetensors files of a checkpoint directory (through the index when present),
// each header's tensors summed by role, headers counted as overhead.
Result<WeightBytes> weight_bytes_from_checkpoint(const std::string& dir, const ModelConfig* config);

// Which shard class a tensor belongs to: the model's own rule (weight_spec.h, what the
// loader does) when `rules` lists it, else by name (the vision tower: replicated).
Shard shard_of_rule(ShardRule rule);
Shard shard_of_tensor(const std::string& name, const std::map<std::string, ShardRule>* rules = nullptr);
// The role a tensor plays, for the weight table ("routed experts", "KDA attention", ...);
// `config` tells MLA from KDA layers (both have q_proj/o_proj) and may be null.
std::string role_of_tensor(const std::string& name, const ModelConfig* config);

}  // namespace moonrun::tools
