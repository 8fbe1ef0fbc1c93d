#include "model/config.h"

#include <fstream>
#include <set>
#include <sstream>
#include <sys/stat.h>

#include "model/families.h"

namespace moonrun {

const char* expert_quant_name(ExpertQuant q) {
  switch (q) {
    case ExpertQuant::none: return "none";
    case ExpertQuant::mxfp4_packed: return "mxfp4-pack-quantized";
    case ExpertQuant::mxfp4_gpt_oss: return "mxfp4 (gpt-oss blocks/scales)";
    case ExpertQuant::int4_g32_sym: return "int4_g32_sym (compressed-tensors pack-quantized)";
  }
  return "?";
}

const char* family_name(Family f) {
  switch (f) {
    case Family::kimi_k3: return "kimi_k3";
    case Family::kimi_linear: return "kimi_linear";
    case Family::kimi_k2: return "kimi_k2";
    case Family::kimi_k31: return "kimi_k31";
  }
  return "?";
}

namespace {

using json = nlohmann::json;

// Reads typed fields of one JSON object, naming "<source>: <path>.<key>" in every error.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string source, std::string path)
      : obj_(obj), source_(std::move(source)), path_(std::move(path)) {}

  std::string where(const std::string& key) const {
    return source_ + ": " + (path_.empty() ? key : path_ + "." + key);
  }
  bool has(const std::string& key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  const json& raw(const std::string& key) const { return obj_[key]; }

  // Integer field; `required` fields must be present, others default to `dflt`.
  Status get_int(const std::string& key, int& out, bool required, int dflt = 0) const {
    if (!has(key)) {
      if (required) return failed_precondition(where(key) + " is missing");
      out = dflt;
      return Status::ok();
    }
    const json& v = obj_[key];
    if (!v.is_number_integer()) return failed_precondition(where(key) + " must be an integer, got " + v.dump());
    int64_t x = v.get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) return failed_precondition(where(key) + " is out of range: " + v.dump());
    out = static_cast<int>(x);
    return Status::ok();
  }
  Status get_positive(const std::string& key, int& out, bool required = true, int dflt = 0) const {
    MR_RETURN_IF_ERROR(get_int(key, out, required, dflt));
    if (has(key) && out <= 0) return failed_precondition(where(key) + " must be positive, got " + std::to_string(out));
    return Status::ok();
  }
  Status get_float(const std::string& key, float& out, bool required, float dflt = 0) const {
    if (!has(key)) {
      if (required) return failed_precondition(where(key) + " is missing");
      out = dflt;
      return Status::ok();
    }
    const json& v = obj_[key];
    if (!v.is_number()) return failed_precondition(where(key) + " must be a number, got " + v.dump());
    out = v.get<float>();
    return Status::ok();
  }
  Status get_bool(const std::string& key, bool& out, bool dflt) const {
    if (!has(key)) {
      out = dflt;
      return Status::ok();
    }
    const json& v = obj_[key];
    if (!v.is_boolean()) return failed_precondition(where(key) + " must be true or false, got " + v.dump());
    out = v.get<bool>();
    return Status::ok();
  }
  Status get_string(const std::string& key, std::string& out, const std::string& dflt) const {
    if (!has(key)) {
      out = dflt;
      return Status::ok();
    }
    const json& v = obj_[key];
    if (!v.is_string()) return failed_precondition(where(key) + " must be a string, got " + v.dump());
    out = v.get<std::string>();
    return Status::ok();
  }
  // A list of 1-based layer numbers, each in [1, num_layers].
  Status get_layer_list(const std::string& key, int num_layers, std::vector<int>& out) const {
    if (!has(key)) return failed_precondition(where(key) + " is missing");
    const json& v = obj_[key];
    if (!v.is_array()) return failed_precondition(where(key) + " must be a list of 1-based layer numbers");
    for (const auto& e : v) {
      if (!e.is_number_integer())
        return failed_precondition(where(key) + " must hold integers, got " + e.dump());
      int64_t layer = e.get<int64_t>();
      if (layer < 1 || layer > num_layers)
        return failed_precondition(where(key) + " lists layer " + std::to_string(layer) +
                                   " but num_hidden_layers is " + std::to_string(num_layers) +
                                   " (the lists are 1-based)");
      out.push_back(static_cast<int>(layer));
    }
    return Status::ok();
  }

 private:
  const json& obj_;
  std::string source_;
  std::string path_;
};

Status parse_quantization(const json& qc, const std::string& where, ModelConfig& cfg) {
  if (qc.is_null()) {
    cfg.expert_quant = ExpertQuant::none;
    return Status::ok();
  }
  if (!qc.is_object()) return failed_precondition(where + " must be an object");
  std::string method = qc.value("quant_method", std::string());
  if (method == "compressed-tensors") {
    // The format may sit at the top of the block or in each config group.
    std::set<std::string> formats;
    if (qc.contains("format") && qc["format"].is_string()) formats.insert(qc["format"].get<std::string>());
    bool int_weights = false;
    if (qc.contains("config_groups") && qc["config_groups"].is_object()) {
      for (const auto& [name, group] : qc["config_groups"].items()) {
        if (group.is_object() && group.contains("format") && group["format"].is_string())
          formats.insert(group["format"].get<std::string>());
        if (group.is_object() && group.contains("weights") && group["weights"].is_object()) {
          const json& w = group["weights"];
          if (w.value("num_bits", 4) != 4 || w.value("group_size", 32) != 32)
            return failed_precondition(where + ".config_groups." + name +
                                       ": only 4-bit weights in groups of 32 (MXFP4, INT4) are supported, got " +
                                       w.dump());
          if (w.value("type", std::string()) == "int") {
            int_weights = true;
            if (!w.value("symmetric", true))
              return failed_precondition(where + ".config_groups." + name +
                                         ": only symmetric INT4 weights (no zero points) are supported, got " +
                                         w.dump());
          }
        }
      }
    }
    if (formats.size() == 1 && *formats.begin() == "mxfp4-pack-quantized") {
      cfg.expert_quant = ExpertQuant::mxfp4_packed;
      return Status::ok();
    }
    if (formats.size() == 1 && *formats.begin() == "pack-quantized" && int_weights) {
      cfg.expert_quant = ExpertQuant::int4_g32_sym;
      return Status::ok();
    }
    std::string got;
    for (const auto& f : formats) got += (got.empty() ? "" : ", ") + f;
    return failed_precondition(where + ": compressed-tensors format \"" + got +
                               "\" is not supported (moonrun reads \"mxfp4-pack-quantized\" and INT4 "
                               "\"pack-quantized\")");
  }
  if (method == "mxfp4") {
    cfg.expert_quant = ExpertQuant::mxfp4_gpt_oss;
    return Status::ok();
  }
  return failed_precondition(where + ".quant_method \"" + method +
                             "\" is not supported (moonrun reads compressed-tensors mxfp4-pack-quantized or "
                             "INT4 pack-quantized, gpt-oss mxfp4, or unquantized checkpoints)");
}

// The config.json keys of the MoE fields: K3's names, or DeepSeek-V3's (the K2 family).
struct MoeKeys {
  const char* num_experts = "num_experts";
  const char* per_token = "num_experts_per_token";
  const char* groups = "num_expert_group";
};
constexpr MoeKeys kDeepseekMoeKeys{"n_routed_experts", "num_experts_per_tok", "n_group"};

// Routing constraints every family's router shares (grouped top-k over sigmoid scores).
Status check_routing(const FieldReader& r, const ModelConfig& cfg, const MoeKeys& keys) {
  if (cfg.num_experts_per_token > cfg.num_experts)
    return failed_precondition(r.where(keys.per_token) + " is " + std::to_string(cfg.num_experts_per_token) +
                               " but " + keys.num_experts + " is " + std::to_string(cfg.num_experts));
  if (cfg.num_experts % cfg.num_expert_group != 0)
    return failed_precondition(r.where(keys.groups) + " " + std::to_string(cfg.num_expert_group) +
                               " does not divide " + keys.num_experts + " " + std::to_string(cfg.num_experts));
  if (cfg.num_expert_group > cfg.topk_group) {  // grouped routing is active
    if (cfg.num_experts / cfg.num_expert_group < 2)
      return failed_precondition(r.where(keys.groups) +
                                 ": grouped routing scores each group by its top-2 experts, so groups "
                                 "need at least 2 experts");
    if (cfg.topk_group * (cfg.num_experts / cfg.num_expert_group) < cfg.num_experts_per_token)
      return failed_precondition(r.where("topk_group") + " " + std::to_string(cfg.topk_group) +
                                 " groups hold fewer experts than " + keys.per_token + " " +
                                 std::to_string(cfg.num_experts_per_token));
  }
  return Status::ok();
}

Status parse_text_config(const json& tc, const std::string& source, const std::string& path,
                         ModelConfig& cfg) {
  FieldReader r(tc, source, path);
  MR_RETURN_IF_ERROR(r.get_positive("vocab_size", cfg.vocab_size));
  MR_RETURN_IF_ERROR(r.get_positive("hidden_size", cfg.hidden_size));
  MR_RETURN_IF_ERROR(r.get_positive("num_hidden_layers", cfg.num_hidden_layers));
  MR_RETURN_IF_ERROR(r.get_positive("num_attention_heads", cfg.num_attention_heads));
  MR_RETURN_IF_ERROR(r.get_positive("intermediate_size", cfg.intermediate_size, false, 0));
  MR_RETURN_IF_ERROR(r.get_float("rms_norm_eps", cfg.rms_norm_eps, false, 1e-6f));
  MR_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", cfg.tie_word_embeddings, cfg.tie_word_embeddings));
  MR_RETURN_IF_ERROR(r.get_int("max_position_embeddings", cfg.max_position_embeddings, false, 4096));

  std::string act;
  MR_RETURN_IF_ERROR(r.get_string("hidden_act", act, "silu"));
  if (act == "situ") {
    cfg.hidden_act = Activation::situ;
    MR_RETURN_IF_ERROR(r.get_float("activation_situ_beta", cfg.situ_beta, false, 1.0f));
    if (cfg.situ_beta == 0.0f) cfg.situ_beta = 1.0f;  // the reference: `beta or 1.0`
    MR_RETURN_IF_ERROR(r.get_float("activation_situ_linear_beta", cfg.situ_linear_beta, false, 0.0f));
  } else if (act == "silu") {
    cfg.hidden_act = Activation::silu;
  } else {
    return failed_precondition(r.where("hidden_act") + " \"" + act + "\" is not supported (situ or silu)");
  }

  // MLA.
  MR_RETURN_IF_ERROR(r.get_int("q_lora_rank", cfg.q_lora_rank, false, 0));
  MR_RETURN_IF_ERROR(r.get_positive("kv_lora_rank", cfg.kv_lora_rank));
  MR_RETURN_IF_ERROR(r.get_positive("qk_nope_head_dim", cfg.qk_nope_head_dim));
  MR_RETURN_IF_ERROR(r.get_int("qk_rope_head_dim", cfg.qk_rope_head_dim, true));
  MR_RETURN_IF_ERROR(r.get_positive("v_head_dim", cfg.v_head_dim));
  MR_RETURN_IF_ERROR(r.get_bool("mla_use_output_gate", cfg.mla_use_output_gate, false));
  if (cfg.q_lora_rank < 0 || cfg.qk_rope_head_dim < 0)
    return failed_precondition(r.where("q_lora_rank") + " and qk_rope_head_dim must be >= 0");
  bool use_nope = false;
  MR_RETURN_IF_ERROR(r.get_bool("mla_use_nope", use_nope, false));
  if (!use_nope)
    return failed_precondition(r.where("mla_use_nope") +
                               " must be true: the K3 / Kimi Linear MLA layers use no rotary embedding "
                               "(the reference asserts it)");
  int kv_heads = cfg.num_attention_heads;
  MR_RETURN_IF_ERROR(r.get_int("num_key_value_heads", kv_heads, false, cfg.num_attention_heads));
  if (kv_heads != cfg.num_attention_heads)
    return failed_precondition(r.where("num_key_value_heads") + " is " + std::to_string(kv_heads) +
                               " but MLA needs it equal to num_attention_heads (" +
                               std::to_string(cfg.num_attention_heads) + ")");

  // Per-layer attention kinds.
  cfg.layers.assign(cfg.num_hidden_layers, LayerSpec{});
  for (auto& l : cfg.layers) l.attn = LayerKind::mla;
  if (r.has("linear_attn_config")) {
    const json& la = r.raw("linear_attn_config");
    if (!la.is_object()) return failed_precondition(r.where("linear_attn_config") + " must be an object");
    FieldReader lr(la, source, (path.empty() ? "" : path + ".") + "linear_attn_config");
    std::vector<int> kda_layers, full_layers;
    MR_RETURN_IF_ERROR(lr.get_layer_list("kda_layers", cfg.num_hidden_layers, kda_layers));
    MR_RETURN_IF_ERROR(lr.get_layer_list("full_attn_layers", cfg.num_hidden_layers, full_layers));
    std::set<int> full(full_layers.begin(), full_layers.end());
    for (int layer : kda_layers) {
      if (full.count(layer))
        return failed_precondition(lr.where("kda_layers") + " and full_attn_layers both list layer " +
                                   std::to_string(layer));
      cfg.layers[layer - 1].attn = LayerKind::kda;
    }
    if (!kda_layers.empty()) {
      MR_RETURN_IF_ERROR(lr.get_positive("num_heads", cfg.kda_num_heads));
      MR_RETURN_IF_ERROR(lr.get_positive("head_dim", cfg.kda_head_dim));
      MR_RETURN_IF_ERROR(lr.get_positive("short_conv_kernel_size", cfg.kda_conv_kernel, false, 4));
      cfg.kda_has_lower_bound = lr.has("gate_lower_bound");
      MR_RETURN_IF_ERROR(lr.get_float("gate_lower_bound", cfg.kda_gate_lower_bound, false, 0.0f));
      MR_RETURN_IF_ERROR(lr.get_bool("use_full_rank_gate", cfg.kda_full_rank_gate, false));
    }
  }
  for (auto& l : cfg.layers) {
    if (l.attn == LayerKind::kda) l.kda_index = cfg.num_kda_layers++;
    else l.mla_index = cfg.num_mla_layers++;
  }

  MR_RETURN_IF_ERROR(r.get_int("attn_res_block_size", cfg.attn_res_block_size, false, 0));
  if (cfg.attn_res_block_size < 0)
    return failed_precondition(r.where("attn_res_block_size") + " must be positive or null");

  // MoE.
  MR_RETURN_IF_ERROR(r.get_int("num_experts", cfg.num_experts, false, 0));
  MR_RETURN_IF_ERROR(r.get_int("first_k_dense_replace", cfg.first_k_dense_replace, false, 0));
  MR_RETURN_IF_ERROR(r.get_positive("moe_layer_freq", cfg.moe_layer_freq, false, 1));
  bool any_dense = false;
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    bool moe = cfg.num_experts > 0 && i >= cfg.first_k_dense_replace && i % cfg.moe_layer_freq == 0;
    cfg.layers[i].mlp = moe ? MlpKind::moe : MlpKind::dense;
    any_dense |= !moe;
  }
  if (any_dense && cfg.intermediate_size <= 0)
    return failed_precondition(r.where("intermediate_size") + " is needed by the dense MLP layers");
  if (cfg.num_experts > 0) {
    MR_RETURN_IF_ERROR(r.get_positive("num_experts_per_token", cfg.num_experts_per_token));
    MR_RETURN_IF_ERROR(r.get_positive("moe_intermediate_size", cfg.moe_intermediate_size));
    MR_RETURN_IF_ERROR(r.get_int("num_shared_experts", cfg.num_shared_experts, false, 0));
    MR_RETURN_IF_ERROR(r.get_int("routed_expert_hidden_size", cfg.routed_expert_hidden_size, false, 0));
    MR_RETURN_IF_ERROR(r.get_bool("latent_moe_use_norm", cfg.latent_moe_use_norm, false));
    MR_RETURN_IF_ERROR(r.get_bool("moe_renormalize", cfg.moe_renormalize, true));
    MR_RETURN_IF_ERROR(r.get_float("routed_scaling_factor", cfg.routed_scaling_factor, false, 1.0f));
    MR_RETURN_IF_ERROR(r.get_positive("num_expert_group", cfg.num_expert_group, false, 1));
    MR_RETURN_IF_ERROR(r.get_positive("topk_group", cfg.topk_group, false, 1));
    std::string router;
    MR_RETURN_IF_ERROR(r.get_string("moe_router_activation_func", router, "sigmoid"));
    if (router != "sigmoid")
      return failed_precondition(r.where("moe_router_activation_func") + " \"" + router +
                                 "\" is not supported (sigmoid)");
    MR_RETURN_IF_ERROR(check_routing(r, cfg, MoeKeys{}));
    if (cfg.routed_expert_hidden_size < 0)
      return failed_precondition(r.where("routed_expert_hidden_size") + " must be positive or null");
  }

  // Quantization may sit in the text config or (K3) at the top level too.
  if (r.has("quantization_config"))
    MR_RETURN_IF_ERROR(parse_quantization(r.raw("quantization_config"), r.where("quantization_config"), cfg));
  if (cfg.expert_quant != ExpertQuant::none) {
    if (cfg.num_experts == 0)
      return failed_precondition(r.where("quantization_config") + " quantizes routed experts but num_experts is 0");
    if (cfg.expert_io_dim() % 32 != 0 || cfg.moe_intermediate_size % 32 != 0)
      return failed_precondition(r.where("moe_intermediate_size") +
                                 ": MXFP4 experts need input widths divisible by 32 (expert width " +
                                 std::to_string(cfg.expert_io_dim()) + ", intermediate " +
                                 std::to_string(cfg.moe_intermediate_size) + ")");
  }
  return Status::ok();
}

Status check_special_tokens(const std::string& source, const ModelConfig& cfg) {
  for (int id : {cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.media_placeholder_token_id}) {
    if (id >= cfg.vocab_size)
      return failed_precondition(source + ": special token id " + std::to_string(id) +
                                 " is outside the vocabulary (vocab_size " + std::to_string(cfg.vocab_size) + ")");
  }
  return Status::ok();
}

// Rejects expert formats a family's weights are not listed for.
Status check_expert_quant_for_k3(const std::string& source, const ModelConfig& cfg) {
  if (cfg.expert_quant == ExpertQuant::int4_g32_sym)
    return failed_precondition(source + ": quantization_config: INT4 pack-quantized experts are the K2 layout's; " +
                               cfg.model_type + " checkpoints carry bf16 or MXFP4 experts");
  return Status::ok();
}

// rope_scaling: null, {"type" | "rope_type": "yarn", ...} or "default"; other kinds are refused.
Status parse_rope_scaling(const FieldReader& r, RopeScaling& out) {
  out = RopeScaling{};
  if (!r.has("rope_scaling")) return Status::ok();
  const json& rs = r.raw("rope_scaling");
  if (!rs.is_object()) return failed_precondition(r.where("rope_scaling") + " must be an object or null");
  std::string type;
  if (rs.contains("type") && rs["type"].is_string()) type = rs["type"].get<std::string>();
  else if (rs.contains("rope_type") && rs["rope_type"].is_string()) type = rs["rope_type"].get<std::string>();
  if (type == "default" || type.empty()) return Status::ok();
  if (type != "yarn")
    return failed_precondition(r.where("rope_scaling") + ": type \"" + type +
                               "\" is not supported (the K2 family uses yarn)");
  out.yarn = true;
  auto num = [&](const char* key, float& v, bool required, float dflt) -> Status {
    if (!rs.contains(key) || rs[key].is_null()) {
      if (required) return failed_precondition(r.where("rope_scaling") + "." + key + " is missing");
      v = dflt;
      return Status::ok();
    }
    if (!rs[key].is_number())
      return failed_precondition(r.where("rope_scaling") + "." + key + " must be a number, got " + rs[key].dump());
    v = rs[key].get<float>();
    return Status::ok();
  };
  MR_RETURN_IF_ERROR(num("factor", out.factor, true, 1.0f));
  float original = 0;
  MR_RETURN_IF_ERROR(num("original_max_position_embeddings", original, true, 0));
  out.original_max_position_embeddings = static_cast<int>(original);
  MR_RETURN_IF_ERROR(num("beta_fast", out.beta_fast, false, 32.0f));
  MR_RETURN_IF_ERROR(num("beta_slow", out.beta_slow, false, 1.0f));
  MR_RETURN_IF_ERROR(num("mscale", out.mscale, false, 1.0f));
  MR_RETURN_IF_ERROR(num("mscale_all_dim", out.mscale_all_dim, false, 0.0f));
  if (out.factor < 1.0f || out.original_max_position_embeddings <= 0)
    return failed_precondition(r.where("rope_scaling") + ": factor must be >= 1 and original_max_position_embeddings "
                                                         "positive, got " + rs.dump());
  return Status::ok();
}

// A nested checkpoint's vision tower (K3's MoonViT-V2, K2.5's MoonViT): its vision_config,
// run in the checkpoint's dtype (its norm eps follows it: torch_dtype, or transformers 5's
// "dtype", at the top level or in text_config), and the placeholder its rows replace.
Status parse_nested_vision(const json& config, const json& tc, const std::string& source, VisionFlavor flavor,
                           ModelConfig& cfg) {
  std::string dtype_name;
  for (const json* level : {&config, &tc})
    for (const char* key : {"torch_dtype", "dtype"})
      if (dtype_name.empty() && level->contains(key) && (*level)[key].is_string())
        dtype_name = (*level)[key].get<std::string>();
  cfg.vision = MR_TRY(parse_vision_config(config.contains("vision_config") ? config["vision_config"] : json(),
                                          dtype_name, cfg.hidden_size, source, flavor));
  if (cfg.vision.enabled && cfg.media_placeholder_token_id < 0)
    return failed_precondition(source + ": media_placeholder_token_id is missing (the vision tower's rows "
                                        "replace that token in the prompt)");
  return Status::ok();
}

}  // namespace

Status parse_kimi_k3_config(const json& config, const std::string& source, ModelConfig& cfg) {
  FieldReader top(config, source, "");
  if (!top.has("text_config") || !config["text_config"].is_object())
    return failed_precondition(source + ": text_config is missing (a kimi_k3 config nests the text model there)");
  const json& tc = config["text_config"];
  cfg.tensor_prefix = "language_model.model.";
  cfg.lm_head_name = "language_model.lm_head.weight";
  MR_RETURN_IF_ERROR(top.get_bool("tie_word_embeddings", cfg.tie_word_embeddings, false));
  if (top.has("quantization_config") && !tc.contains("quantization_config"))
    MR_RETURN_IF_ERROR(parse_quantization(config["quantization_config"], source + ": quantization_config", cfg));
  MR_RETURN_IF_ERROR(parse_text_config(tc, source, "text_config", cfg));
  MR_RETURN_IF_ERROR(check_expert_quant_for_k3(source, cfg));
  FieldReader ttc(tc, source, "text_config");
  MR_RETURN_IF_ERROR(ttc.get_int("bos_token_id", cfg.bos_token_id, false, -1));
  MR_RETURN_IF_ERROR(ttc.get_int("eos_token_id", cfg.eos_token_id, false, -1));
  MR_RETURN_IF_ERROR(ttc.get_int("pad_token_id", cfg.pad_token_id, false, -1));
  // The top level wins: it is what the K3 wrapper and the tokenizer use.
  MR_RETURN_IF_ERROR(top.get_int("bos_token_id", cfg.bos_token_id, false, cfg.bos_token_id));
  MR_RETURN_IF_ERROR(top.get_int("eos_token_id", cfg.eos_token_id, false, cfg.eos_token_id));
  MR_RETURN_IF_ERROR(top.get_int("pad_token_id", cfg.pad_token_id, false, cfg.pad_token_id));
  MR_RETURN_IF_ERROR(top.get_int("media_placeholder_token_id", cfg.media_placeholder_token_id, false, -1));
  MR_RETURN_IF_ERROR(parse_nested_vision(config, tc, source, VisionFlavor::kK3, cfg));
  return check_special_tokens(source, cfg);
}

Status parse_kimi_linear_config(const json& config, const std::string& source, ModelConfig& cfg) {
  FieldReader top(config, source, "");
  cfg.tensor_prefix = "model.";
  cfg.lm_head_name = "lm_head.weight";
  MR_RETURN_IF_ERROR(parse_text_config(config, source, "", cfg));
  MR_RETURN_IF_ERROR(check_expert_quant_for_k3(source, cfg));
  MR_RETURN_IF_ERROR(top.get_int("bos_token_id", cfg.bos_token_id, false, -1));
  MR_RETURN_IF_ERROR(top.get_int("eos_token_id", cfg.eos_token_id, false, -1));
  MR_RETURN_IF_ERROR(top.get_int("pad_token_id", cfg.pad_token_id, false, -1));
  return check_special_tokens(source, cfg);
}

// The K2 generation: transformers' DeepseekV3Config, flat (kimi_k2, DeepseekV3ForCausalLM) or
// under "text_config" (kimi_k25, KimiK25ForConditionalGeneration, with a vision tower).
Status parse_kimi_k2_config(const json& config, const std::string& source, ModelConfig& cfg) {
  FieldReader top(config, source, "");
  const bool nested = top.has("text_config");
  if (nested && !config["text_config"].is_object())
    return failed_precondition(source + ": text_config must be an object");
  if (!nested && cfg.model_type == "kimi_k25")
    return failed_precondition(source + ": text_config is missing (a kimi_k25 config nests the text model there)");
  const json& tc = nested ? config["text_config"] : config;
  const std::string path = nested ? "text_config" : "";
  FieldReader r(tc, source, path);
  cfg.tensor_prefix = nested ? "language_model.model." : "model.";
  cfg.lm_head_name = nested ? "language_model.lm_head.weight" : "lm_head.weight";
  cfg.k2.vision_tower = top.has("vision_config");

  MR_RETURN_IF_ERROR(r.get_positive("vocab_size", cfg.vocab_size));
  MR_RETURN_IF_ERROR(r.get_positive("hidden_size", cfg.hidden_size));
  MR_RETURN_IF_ERROR(r.get_positive("num_hidden_layers", cfg.num_hidden_layers));
  MR_RETURN_IF_ERROR(r.get_positive("num_attention_heads", cfg.num_attention_heads));
  MR_RETURN_IF_ERROR(r.get_positive("intermediate_size", cfg.intermediate_size, false, 0));
  MR_RETURN_IF_ERROR(r.get_float("rms_norm_eps", cfg.rms_norm_eps, false, 1e-6f));
  MR_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", cfg.tie_word_embeddings, false));
  if (nested) MR_RETURN_IF_ERROR(top.get_bool("tie_word_embeddings", cfg.tie_word_embeddings, cfg.tie_word_embeddings));
  MR_RETURN_IF_ERROR(r.get_int("max_position_embeddings", cfg.max_position_embeddings, false, 4096));
  std::string act;
  MR_RETURN_IF_ERROR(r.get_string("hidden_act", act, "silu"));
  if (act != "silu") return failed_precondition(r.where("hidden_act") + " \"" + act + "\" is not supported (silu)");
  cfg.hidden_act = Activation::silu;

  // MLA with rotary embeddings on the rope dims and no output gate.
  MR_RETURN_IF_ERROR(r.get_int("q_lora_rank", cfg.q_lora_rank, false, 0));
  MR_RETURN_IF_ERROR(r.get_positive("kv_lora_rank", cfg.kv_lora_rank));
  MR_RETURN_IF_ERROR(r.get_positive("qk_nope_head_dim", cfg.qk_nope_head_dim));
  MR_RETURN_IF_ERROR(r.get_positive("qk_rope_head_dim", cfg.qk_rope_head_dim));
  MR_RETURN_IF_ERROR(r.get_positive("v_head_dim", cfg.v_head_dim));
  if (cfg.q_lora_rank < 0) return failed_precondition(r.where("q_lora_rank") + " must be >= 0 or null");
  if (cfg.qk_rope_head_dim % 2 != 0)
    return failed_precondition(r.where("qk_rope_head_dim") + " must be even (rotary pairs), got " +
                               std::to_string(cfg.qk_rope_head_dim));
  cfg.mla_use_output_gate = false;
  int kv_heads = cfg.num_attention_heads;
  MR_RETURN_IF_ERROR(r.get_int("num_key_value_heads", kv_heads, false, cfg.num_attention_heads));
  if (kv_heads != cfg.num_attention_heads)
    return failed_precondition(r.where("num_key_value_heads") + " is " + std::to_string(kv_heads) +
                               " but MLA needs it equal to num_attention_heads (" +
                               std::to_string(cfg.num_attention_heads) + ")");
  MR_RETURN_IF_ERROR(r.get_float("rope_theta", cfg.k2.rope_theta, false, 10000.0f));
  MR_RETURN_IF_ERROR(parse_rope_scaling(r, cfg.k2.rope_scaling));
  cfg.layers.assign(cfg.num_hidden_layers, LayerSpec{});
  cfg.num_kda_layers = 0;
  cfg.num_mla_layers = 0;
  for (auto& l : cfg.layers) {
    l.attn = LayerKind::mla;
    l.mla_index = cfg.num_mla_layers++;
  }

  // DeepSeek-V3 MoE: layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0.
  MR_RETURN_IF_ERROR(r.get_int("n_routed_experts", cfg.num_experts, false, 0));
  MR_RETURN_IF_ERROR(r.get_int("first_k_dense_replace", cfg.first_k_dense_replace, false, 0));
  MR_RETURN_IF_ERROR(r.get_positive("moe_layer_freq", cfg.moe_layer_freq, false, 1));
  if (cfg.num_experts < 0) return failed_precondition(r.where("n_routed_experts") + " must be >= 0 or null");
  bool any_dense = false;
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    const bool moe = cfg.num_experts > 0 && i >= cfg.first_k_dense_replace && i % cfg.moe_layer_freq == 0;
    cfg.layers[i].mlp = moe ? MlpKind::moe : MlpKind::dense;
    any_dense |= !moe;
  }
  if (any_dense && cfg.intermediate_size <= 0)
    return failed_precondition(r.where("intermediate_size") + " is needed by the dense MLP layers");
  if (cfg.num_experts > 0) {
    MR_RETURN_IF_ERROR(r.get_positive("num_experts_per_tok", cfg.num_experts_per_token));
    MR_RETURN_IF_ERROR(r.get_positive("moe_intermediate_size", cfg.moe_intermediate_size));
    MR_RETURN_IF_ERROR(r.get_int("n_shared_experts", cfg.num_shared_experts, false, 0));
    if (cfg.num_shared_experts < 0) return failed_precondition(r.where("n_shared_experts") + " must be >= 0");
    MR_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", cfg.k2.norm_topk_prob, true));
    cfg.moe_renormalize = cfg.k2.norm_topk_prob;
    MR_RETURN_IF_ERROR(r.get_float("routed_scaling_factor", cfg.routed_scaling_factor, false, 1.0f));
    MR_RETURN_IF_ERROR(r.get_positive("n_group", cfg.num_expert_group, false, 1));
    MR_RETURN_IF_ERROR(r.get_positive("topk_group", cfg.topk_group, false, 1));
    MR_RETURN_IF_ERROR(r.get_string("topk_method", cfg.k2.topk_method, "noaux_tc"));
    if (cfg.k2.topk_method != "noaux_tc")
      return failed_precondition(r.where("topk_method") + " \"" + cfg.k2.topk_method +
                                 "\" is not supported (noaux_tc: sigmoid scores + e_score_correction_bias)");
    MR_RETURN_IF_ERROR(r.get_string("scoring_func", cfg.k2.scoring_func, "sigmoid"));
    if (cfg.k2.scoring_func != "sigmoid")
      return failed_precondition(r.where("scoring_func") + " \"" + cfg.k2.scoring_func +
                                 "\" is not supported (sigmoid)");
    MR_RETURN_IF_ERROR(check_routing(r, cfg, kDeepseekMoeKeys));
  }

  // INT4 routed experts (or bf16 ones in test checkpoints); the block may sit in text_config
  // or at the top level.
  if (r.has("quantization_config"))
    MR_RETURN_IF_ERROR(parse_quantization(r.raw("quantization_config"), r.where("quantization_config"), cfg));
  else if (nested && top.has("quantization_config"))
    MR_RETURN_IF_ERROR(parse_quantization(config["quantization_config"], source + ": quantization_config", cfg));
  if (cfg.expert_quant != ExpertQuant::none && cfg.expert_quant != ExpertQuant::int4_g32_sym)
    return failed_precondition(source + ": quantization_config: " + expert_quant_name(cfg.expert_quant) +
                               " experts are not a K2 layout (it stores INT4 pack-quantized or bf16 experts)");
  if (cfg.expert_quant == ExpertQuant::int4_g32_sym) {
    if (cfg.num_experts == 0)
      return failed_precondition(source + ": quantization_config quantizes routed experts but n_routed_experts is 0");
    if (cfg.hidden_size % 32 != 0 || cfg.moe_intermediate_size % 32 != 0)
      return failed_precondition(r.where("moe_intermediate_size") +
                                 ": INT4 experts need input widths divisible by 32 (hidden " +
                                 std::to_string(cfg.hidden_size) + ", intermediate " +
                                 std::to_string(cfg.moe_intermediate_size) + ")");
  }

  MR_RETURN_IF_ERROR(r.get_int("bos_token_id", cfg.bos_token_id, false, -1));
  MR_RETURN_IF_ERROR(r.get_int("eos_token_id", cfg.eos_token_id, false, -1));
  MR_RETURN_IF_ERROR(r.get_int("pad_token_id", cfg.pad_token_id, false, -1));
  if (nested) {
    MR_RETURN_IF_ERROR(top.get_int("bos_token_id", cfg.bos_token_id, false, cfg.bos_token_id));
    MR_RETURN_IF_ERROR(top.get_int("eos_token_id", cfg.eos_token_id, false, cfg.eos_token_id));
    MR_RETURN_IF_ERROR(top.get_int("pad_token_id", cfg.pad_token_id, false, cfg.pad_token_id));
    MR_RETURN_IF_ERROR(top.get_int("media_placeholder_token_id", cfg.media_placeholder_token_id, false, -1));
    // K2.5's MoonViT tower and "patchmerger" projector (vision_config.h's kK25 defaults).
    MR_RETURN_IF_ERROR(parse_nested_vision(config, tc, source, VisionFlavor::kK25, cfg));
  }
  return check_special_tokens(source, cfg);
}

// K3.1 (issue 38): K3's config.json, with text_config.dsa_config naming the DSA layers and
// the indexer's sizes. The key names are DeepSeek-V3.2's (index_n_heads, index_head_dim,
// index_topk) plus dsa_layers in linear_attn_config's style; no public K3.1 config.json,
// vLLM kimi_k3 source or llama.cpp K3.1 source could be read when this was written, so they
// follow the text and are to be checked against the release.
Status parse_kimi_k31_config(const json& config, const std::string& source, ModelConfig& cfg) {
  MR_RETURN_IF_ERROR(parse_kimi_k3_config(config, source, cfg));
  const json& tc = config["text_config"];
  const bool in_text = tc.contains("dsa_config") && !tc["dsa_config"].is_null();
  const bool at_top = config.contains("dsa_config") && !config["dsa_config"].is_null();
  if (!in_text && !at_top)
    return failed_precondition(source + ": text_config.dsa_config is missing (a kimi_k31 config names its "
                                        "DeepSeek Sparse Attention layers there)");
  const json& dc = in_text ? tc["dsa_config"] : config["dsa_config"];
  const std::string path = in_text ? "text_config.dsa_config" : "dsa_config";
  if (!dc.is_object()) return failed_precondition(source + ": " + path + " must be an object");
  FieldReader r(dc, source, path);
  DsaPart& d = cfg.dsa;
  d = DsaPart{};
  MR_RETURN_IF_ERROR(r.get_layer_list("dsa_layers", cfg.num_hidden_layers, d.layers));
  MR_RETURN_IF_ERROR(r.get_positive("index_n_heads", d.index_n_heads));
  MR_RETURN_IF_ERROR(r.get_positive("index_head_dim", d.index_head_dim));
  MR_RETURN_IF_ERROR(r.get_positive("index_topk", d.index_topk));
  // The indexer key's LayerNorm: the config declares no eps of its own.
  d.k_norm_eps = cfg.rms_norm_eps;
  if (cfg.q_lora_rank <= 0)
    return failed_precondition(source + ": text_config.q_lora_rank is null but the DSA indexer's wq_b reads the "
                                        "query latent (q_lora_rank > 0)");
  // The DSA layers must be exactly the full-attention (MLA) layers: each once, none missing.
  std::set<int> dsa;
  for (int layer : d.layers)
    if (!dsa.insert(layer).second)
      return failed_precondition(r.where("dsa_layers") + " lists layer " + std::to_string(layer) + " twice");
  std::string missing, extra;
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    const bool mla = cfg.layers[i].attn == LayerKind::mla;
    if (mla && !dsa.count(i + 1)) missing += (missing.empty() ? "" : ", ") + std::to_string(i + 1);
    if (!mla && dsa.count(i + 1)) extra += (extra.empty() ? "" : ", ") + std::to_string(i + 1);
  }
  if (!extra.empty())
    return failed_precondition(r.where("dsa_layers") + " lists layer(s) " + extra +
                               " that linear_attn_config makes KDA layers (the DSA layers are exactly the "
                               "full-attention layers, 1-based)");
  if (!missing.empty())
    return failed_precondition(r.where("dsa_layers") + " leaves out full-attention layer(s) " + missing +
                               " (the DSA layers are exactly the full-attention layers, 1-based)");
  cfg.num_dsa_layers = 0;
  for (auto& l : cfg.layers)
    if (l.attn == LayerKind::mla) l.dsa_index = cfg.num_dsa_layers++;
  return Status::ok();
}

Result<ModelConfig> parse_model_config(const json& config, const std::string& source) {
  if (!config.is_object()) return failed_precondition(source + ": the top level must be a JSON object");
  const ModelFamilyRow& row = *MR_TRY(find_model_family(config, source));
  ModelConfig cfg;
  cfg.family = row.family;
  FieldReader top(config, source, "");
  MR_RETURN_IF_ERROR(top.get_string("model_type", cfg.model_type, ""));
  cfg.architecture = architecture_of(config);
  MR_RETURN_IF_ERROR(row.parse(config, source, cfg));
  return cfg;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  std::string file = path;
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) file = path + "/config.json";
  std::ifstream in(file);
  if (!in) return not_found(file + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return failed_precondition(file + ": not valid JSON");
  return parse_model_config(j, file);
}

}  // namespace moonrun
