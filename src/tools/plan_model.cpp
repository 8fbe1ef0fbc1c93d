// Model shape and weight bytes for `moonrun plan` (see plan_model.h).
#include "tools/plan_model.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "model/weight_spec.h"

namespace moonrun::tools {

namespace fs = std::filesystem;
using nlohmann::json;

Result<PlanModelShape> plan_shape_from_config(const json& config, const std::string& source) {
  PlanModelShape s;
  s.config = MR_TRY(parse_model_config(config, source));
  const ModelConfig& c = s.config;
  s.name = source;
  s.hidden = c.hidden_size;
  s.n_layers = c.num_hidden_layers;
  s.vocab = c.vocab_size;
  s.n_heads = c.num_attention_heads;
  s.n_mla_layers = c.num_mla_layers;
  s.n_kda_layers = c.num_kda_layers;
  s.kda_heads = c.kda_num_heads;
  s.kda_head_dim = c.kda_head_dim;
  s.kda_conv_kernel = c.kda_conv_kernel;
  s.kda_full_rank_gate = c.kda_full_rank_gate;
  s.q_lora_rank = c.q_lora_rank;
  s.kv_lora_rank = c.kv_lora_rank;
  s.qk_nope_head_dim = c.qk_nope_head_dim;
  s.qk_rope_head_dim = c.qk_rope_head_dim;
  s.v_head_dim = c.v_head_dim;
  s.mla_output_gate = c.mla_use_output_gate;
  s.n_dsa_layers = c.num_dsa_layers;
  s.dsa_key_bytes = c.num_dsa_layers > 0 ? c.dsa.key_cache_bytes() : 0;
  s.dense_intermediate = c.intermediate_size;
  s.first_k_dense = c.first_k_dense_replace;
  s.n_experts = c.num_experts;
  s.n_experts_per_token = c.num_experts_per_token;
  s.n_shared_experts = c.num_shared_experts;
  s.moe_intermediate = c.moe_intermediate_size;
  s.latent_moe_hidden = c.routed_expert_hidden_size;
  s.experts_mxfp4 = c.expert_quant == ExpertQuant::mxfp4_packed || c.expert_quant == ExpertQuant::mxfp4_gpt_oss;
  s.tie_word_embeddings = c.tie_word_embeddings;
  s.max_context = c.max_position_embeddings;
  s.has_vision = config.contains("vision_config") && config["vision_config"].is_object();
  if (s.has_vision) s.vision_config = config["vision_config"];
  if (s.hidden == 0 || s.n_layers == 0 || s.n_heads == 0)
    return invalid_argument(source + ": hidden_size, num_hidden_layers and num_attention_heads must be positive");
  return s;
}

const char* shard_name(Shard s) {
  switch (s) {
    case Shard::kTensorParallel: return "TP";
    case Shard::kExpertParallel: return "EP";
    case Shard::kReplicated: return "replicated";
  }
  return "?";
}

uint64_t WeightBytes::total_bytes() const {
  uint64_t t = file_overhead_bytes;
  for (const auto& g : groups) t += g.bytes;
  return t;
}

uint64_t WeightBytes::bytes_of(Shard s) const {
  uint64_t t = 0;
  for (const auto& g : groups)
    if (g.shard == s) t += g.bytes;
  return t;
}

// ---- config-only byte count ---------------------------------------------------------

namespace {

constexpr uint64_t kBf16 = 2;

// Accumulates tensors into named groups, keeping the order groups first appear in.
class GroupTable {
 public:
  void add(const std::string& group, Shard shard, uint64_t count, uint64_t bytes_each,
           bool estimated = false) {
    std::string key = group + "|" + shard_name(shard);
    auto it = index_.find(key);
    if (it == index_.end()) {
      it = index_.emplace(key, groups_.size()).first;
      groups_.push_back({group, shard, 0, 0, estimated});
    }
    groups_[it->second].bytes += count * bytes_each;
    groups_[it->second].n_tensors += count;
  }
  // bf16 matrix [out, in] (or a vector when in == 1).
  void bf16(const std::string& g, Shard s, uint64_t count, uint64_t out, uint64_t in = 1,
            bool est = false) {
    add(g, s, count, out * in * kBf16, est);
  }
  std::vector<WeightGroup> take() { return std::move(groups_); }

 private:
  std::map<std::string, size_t> index_;
  std::vector<WeightGroup> groups_;
};

// MoonViT-V2 + PatchMergerMLPV2 projector. The published vision_config names only
// patch_size and merge_kernel_size; other sizes fall back to the reference defaults
// (configuration_kimi_k3.py), so the group is marked estimated.
void add_vision_tower(GroupTable& t, const json& vc, int64_t text_hidden) {
  const std::string g = "vision tower + projector";
  const auto R = Shard::kReplicated;
  bool est = false;
  auto field = [&](const char* key, int64_t fallback) {
    auto it = vc.find(key);
    if (it != vc.end() && it->is_number_integer()) return it->get<int64_t>();
    est = true;
    return fallback;
  };
  // K2.5's vision_config names the tower's sizes as a transformers config does (hidden_size,
  // num_hidden_layers, intermediate_size; q, k, v each hidden wide) and adds biases to every
  // linear and LayerNorm, and a patchmerger projector (LayerNorm per patch row, two linears).
  const bool k25 = vc.value("mm_projector_type", std::string()) == "patchmerger" || vc.contains("hidden_size");
  const uint64_t w = k25 ? field("hidden_size", 1152) : field("vt_hidden_size", 1024),
                 layers = k25 ? field("num_hidden_layers", 27) : field("vt_num_hidden_layers", 27),
                 ffn = k25 ? field("intermediate_size", 4304) : field("vt_intermediate_size", 4096),
                 qkv = k25 ? w : field("qkv_hidden_size", 1536), patch = field("patch_size", 14),
                 pos_h = field("init_pos_emb_height", 64), pos_w = field("init_pos_emb_width", 64),
                 mm = field("mm_hidden_size", int64_t(w));
  uint64_t merge = 4;
  if (auto it = vc.find("merge_kernel_size"); it != vc.end() && it->is_array() && it->size() == 2 &&
                                              (*it)[0].is_number_integer() && (*it)[1].is_number_integer())
    merge = (*it)[0].get<uint64_t>() * (*it)[1].get<uint64_t>();
  else
    est = true;
  t.bf16(g, R, 1, w, 3 * patch * patch, est);  // patch embed conv [w, 3, p, p]
  t.bf16(g, R, 1, pos_h * pos_w, w, est);       // learnable 2-D position table
  t.bf16(g, R, layers * 2, w, 1, est);          // norm0, norm1
  t.bf16(g, R, layers, 3 * qkv, w, est);        // wqkv
  t.bf16(g, R, layers, w, qkv, est);            // wo
  t.bf16(g, R, layers, ffn, w, est);            // fc0
  t.bf16(g, R, layers, w, ffn, est);            // fc1
  t.bf16(g, R, 1, w, 1, est);                   // final norm
  const uint64_t merged = mm * merge;           // 2x2 patches concatenated
  t.bf16(g, R, 1, merged, merged, est);
  t.bf16(g, R, 1, text_hidden, merged, est);
  if (!k25) {
    t.bf16(g, R, 1, text_hidden, 1, est);  // post_norm
    return;
  }
  // K2.5: the biases (patch embed, per layer the LayerNorms', wqkv's, wo's, fc0's, fc1's, the
  // final LayerNorm's) and the projector's pre-norm (weight and bias per patch row) and biases.
  t.bf16(g, R, 1, w, 1, est);
  t.bf16(g, R, layers, 2 * w + 3 * qkv + w + ffn + w, 1, est);
  t.bf16(g, R, 1, w, 1, est);
  t.bf16(g, R, 1, 2 * mm + merged + text_hidden, 1, est);
}

}  // namespace

WeightBytes weight_bytes_from_config(const PlanModelShape& s) {
  GroupTable t;
  uint64_t header_bytes = 0;
  for (const TensorSpec& e : weight_spec(s.config)) {
    // The loader's own rule for the tensor (weight_spec.h), so plan splits what it splits.
    t.add(role_of_tensor(e.name, &s.config), shard_of_rule(e.shard), 1, e.nbytes());
    // Its header entry as the safetensors writer spells it, with 11-digit offsets (shards of
    // ~16 GB): "NAME":{"dtype":"U8","shape":[3072,1792],"data_offsets":[X,Y]},
    std::string shape;
    for (int64_t d : e.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header_bytes += e.name.size() + std::string(dtype_name(e.dtype)).size() + shape.size() + 2 * 11 + 48;
  }
  if (s.has_vision) add_vision_tower(t, s.vision_config, s.hidden);

  WeightBytes wb;
  wb.groups = t.take();
  for (const auto& g : wb.groups)
    if (g.estimated) header_bytes += g.n_tensors * 90;  // short vision names
  wb.file_overhead_bytes = header_bytes;
  wb.exact = false;
  wb.note = "computed from config.json: weight_spec() of the model's name table";
  return wb;
}

std::string role_of_tensor(const std::string& name, const ModelConfig* cfg) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has(".experts.") && !has("shared_experts.")) {
    if (cfg && cfg->expert_quant == ExpertQuant::int4_g32_sym) return "routed experts (INT4)";
    return has("weight_packed") || has("weight_scale") || has("weight_blocks") ? "routed experts (MXFP4)"
                                                                              : "routed experts";
  }
  if (name.rfind("vision_tower.", 0) == 0 || name.rfind("mm_projector.", 0) == 0) return "vision tower + projector";
  if (has("embed_tokens") || has("lm_head")) return "embeddings + lm_head";
  if (has("block_sparse_moe.gate.") || has(".mlp.gate.")) return "MoE router";
  if (has("shared_experts.")) return "shared experts";
  if (has("routed_expert_down_proj") || has("routed_expert_up_proj")) return "LatentMoE down/up projections";
  if (has(".mlp.")) return "dense MLP";
  if (has(".self_attn.indexer.")) return "DSA indexer";  // K3.1 (replicated: kimi_k31.h)
  if (has(".self_attn.")) {
    // "...layers.N.self_attn...": the layer's kind decides MLA or KDA.
    const size_t at = name.find("layers.");
    if (cfg && at != std::string::npos) {
      const int layer = std::atoi(name.c_str() + at + 7);
      if (layer >= 0 && layer < int(cfg->layers.size()))
        return cfg->layers[size_t(layer)].attn == LayerKind::mla ? "MLA attention" : "KDA attention";
    }
    return "attention";
  }
  return "norms + attention residuals";
}

Shard shard_of_rule(ShardRule rule) {
  switch (rule) {
    case ShardRule::replicated: return Shard::kReplicated;
    case ShardRule::expert: return Shard::kExpertParallel;
    case ShardRule::column:
    case ShardRule::row:
    case ShardRule::vocab: return Shard::kTensorParallel;
  }
  return Shard::kReplicated;
}

Shard shard_of_tensor(const std::string& name, const std::map<std::string, ShardRule>* rules) {
  if (rules) {
    auto it = rules->find(name);
    if (it != rules->end()) return shard_of_rule(it->second);
  }
  // Tensors the model does not list (the vision tower: every rank runs it whole), or no
  // config to list them from: by name.
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has(".experts.")) return Shard::kExpertParallel;
  if (name.rfind("vision_tower.", 0) == 0 || name.rfind("mm_projector.", 0) == 0)
    return Shard::kReplicated;
  if (has("norm") || has("_res_") || has(".indexer.") || has(".gate.weight") || has("e_score_correction_bias") ||
      has("q_a_proj") || has("kv_a_proj") || has("f_a_proj") || has("g_a_proj") ||
      has("routed_expert_down_proj") || has("routed_expert_up_proj"))
    return Shard::kReplicated;
  return Shard::kTensorParallel;
}

// ---- exact byte count from a checkpoint's headers -------------------------------------

Result<WeightBytes> weight_bytes_from_checkpoint(const std::string& dir, const ModelConfig* config) {
  std::map<std::string, ShardRule> rules;  // the model's listing: how the loader splits each tensor
  if (config)
    for (const TensorSpec& e : weight_spec(*config)) rules.emplace(e.name, e.shard);
  std::vector<fs::path> files;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path);
    json index = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return invalid_argument(index_path.string() + ": not a safetensors index (no weight_map object)");
    std::set<std::string> names;
    for (const auto& [tensor, file] : index["weight_map"].items())
      if (file.is_string()) names.insert(file.get<std::string>());
    for (const auto& n : names) files.push_back(fs::path(dir) / n);
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) return not_found(dir + ": no .safetensors files (and no model.safetensors.index.json)");

  GroupTable t;
  uint64_t overhead = 0;
  for (const auto& f : files) {
    const std::string fname = f.string();
    const uint64_t size = fs::file_size(f, ec);  // follows HF-cache symlinks into blobs/
    if (ec) return not_found(fname + ": listed in the index but missing (" + ec.message() + ")");
    std::ifstream in(f, std::ios::binary);
    uint8_t len_bytes[8];
    if (size < 8 || !in.read(reinterpret_cast<char*>(len_bytes), 8))
      return data_loss(fname + ": shorter than the 8-byte safetensors header length");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];  // little-endian
    if (header_len > size - 8)
      return data_loss(fname + ": header length " + std::to_string(header_len) +
                       " runs past the end of the file (" + std::to_string(size) + " bytes)");
    std::string header(header_len, '\0');
    if (!in.read(header.data(), std::streamsize(header_len)))
      return data_loss(fname + ": could not read the " + std::to_string(header_len) + "-byte header");
    json h = json::parse(header, nullptr, false);
    if (h.is_discarded() || !h.is_object()) return data_loss(fname + ": header is not a JSON object");
    uint64_t data_bytes = 0;
    for (const auto& [name, info] : h.items()) {
      if (name == "__metadata__") continue;
      auto off = info.find("data_offsets");
      if (off == info.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
          !(*off)[1].is_number_unsigned() || (*off)[1].get<uint64_t>() < (*off)[0].get<uint64_t>())
        return data_loss(fname + ": tensor " + name + " has no valid data_offsets");
      const uint64_t nbytes = (*off)[1].get<uint64_t>() - (*off)[0].get<uint64_t>();
      data_bytes += nbytes;
      t.add(role_of_tensor(name, config), shard_of_tensor(name, config ? &rules : nullptr), 1, nbytes);
    }
    if (data_bytes + 8 + header_len > size)
      return data_loss(fname + ": tensors need " + std::to_string(data_bytes + 8 + header_len) +
                       " bytes but the file has " + std::to_string(size) + " (truncated?)");
    overhead += size - data_bytes;  // 8-byte length, JSON header, padding
  }
  WeightBytes wb;
  wb.groups = t.take();
  wb.file_overhead_bytes = overhead;
  wb.exact = true;
  wb.note = "exact: " + std::to_string(files.size()) + " safetensors files under " + dir;
  return wb;
}

}  // namespace moonrun::tools
