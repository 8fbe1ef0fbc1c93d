// Model shape and weight bytes for `moonrun plan` (see plan_model.h).
#include "tools/plan_model.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace moonrun::tools {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---- config.json fields ------------------------------------------------------------

Result<int64_t> get_int(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return invalid_argument(where + ": missing field " + key);
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    return invalid_argument(where + ": field " + key + " must be a non-negative integer");
  return it->get<int64_t>();
}

int64_t get_int_or(const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return fallback;
  return it->get<int64_t>();
}

bool get_bool_or(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_boolean()) return fallback;
  return it->get<bool>();
}

// True when the quantization config puts the routed experts in MXFP4: compressed-tensors
// with a 4-bit float group scheme, or the gpt-oss spelling quant_method "mxfp4".
bool experts_are_mxfp4(const json& text, int64_t* group_size) {
  auto it = text.find("quantization_config");
  if (it == text.end() || !it->is_object()) return false;
  const json& q = *it;
  if (q.value("quant_method", "") == "mxfp4") return true;
  if (q.value("format", "").find("mxfp4") == std::string::npos) return false;
  if (auto g = q.find("config_groups"); g != q.end() && g->is_object()) {
    for (const auto& [name, group] : g->items()) {
      if (group.contains("weights") && group["weights"].is_object())
        *group_size = get_int_or(group["weights"], "group_size", 32);
    }
  }
  return true;
}

}  // namespace

Result<PlanModelShape> plan_shape_from_config(const json& config, const std::string& source) {
  if (!config.is_object()) return invalid_argument(source + ": config is not a JSON object");
  const bool nested = config.contains("text_config") && config["text_config"].is_object();
  const json& text = nested ? config["text_config"] : config;
  const std::string where = nested ? source + ": text_config" : source;

  PlanModelShape s;
  s.name = source;
  s.hidden = MR_TRY(get_int(text, "hidden_size", where));
  s.n_layers = MR_TRY(get_int(text, "num_hidden_layers", where));
  s.vocab = MR_TRY(get_int(text, "vocab_size", where));
  s.n_heads = MR_TRY(get_int(text, "num_attention_heads", where));
  s.dense_intermediate = get_int_or(text, "intermediate_size", 0);
  s.first_k_dense = get_int_or(text, "first_k_dense_replace", 0);
  s.n_experts = get_int_or(text, "num_experts", get_int_or(text, "n_routed_experts", 0));
  s.n_experts_per_token =
      get_int_or(text, "num_experts_per_token", get_int_or(text, "num_experts_per_tok", 0));
  s.n_shared_experts = get_int_or(text, "num_shared_experts", get_int_or(text, "n_shared_experts", 0));
  s.moe_intermediate = get_int_or(text, "moe_intermediate_size", 0);
  s.latent_moe_hidden = get_int_or(text, "routed_expert_hidden_size", 0);
  s.q_lora_rank = get_int_or(text, "q_lora_rank", 0);
  s.kv_lora_rank = MR_TRY(get_int(text, "kv_lora_rank", where));
  s.qk_nope_head_dim = MR_TRY(get_int(text, "qk_nope_head_dim", where));
  s.qk_rope_head_dim = MR_TRY(get_int(text, "qk_rope_head_dim", where));
  s.v_head_dim = MR_TRY(get_int(text, "v_head_dim", where));
  s.mla_output_gate = get_bool_or(text, "mla_use_output_gate", false);
  s.tie_word_embeddings =
      get_bool_or(text, "tie_word_embeddings", get_bool_or(config, "tie_word_embeddings", false));
  s.max_context = get_int_or(text, "max_position_embeddings", 0);
  s.experts_mxfp4 = experts_are_mxfp4(text, &s.mxfp4_group_size);
  s.has_vision = config.contains("vision_config") && config["vision_config"].is_object();
  if (s.has_vision) s.vision_config = config["vision_config"];

  if (s.hidden == 0 || s.n_layers == 0 || s.n_heads == 0)
    return invalid_argument(where + ": hidden_size, num_hidden_layers and num_attention_heads must be positive");
  if (s.first_k_dense > s.n_layers)
    return invalid_argument(where + ": first_k_dense_replace exceeds num_hidden_layers");
  if (s.n_experts > 0 && s.moe_intermediate == 0)
    return invalid_argument(where + ": num_experts is set but moe_intermediate_size is missing");

  // Layer kinds: 1-based lists in linear_attn_config; without one every layer is MLA.
  auto lac = text.find("linear_attn_config");
  if (lac != text.end() && lac->is_object()) {
    const std::string lwhere = where + ".linear_attn_config";
    std::set<int64_t> full, kda;
    for (const char* key : {"full_attn_layers", "kda_layers"}) {
      auto it = lac->find(key);
      if (it == lac->end() || !it->is_array())
        return invalid_argument(lwhere + ": missing list " + key);
      for (const auto& v : *it) {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > s.n_layers)
          return invalid_argument(lwhere + "." + key + " lists layer " + v.dump() +
                                  " but num_hidden_layers is " + std::to_string(s.n_layers) +
                                  " (layers are 1-based)");
        (std::string(key) == "kda_layers" ? kda : full).insert(v.get<int64_t>());
      }
    }
    for (int64_t l : full)
      if (kda.count(l))
        return invalid_argument(lwhere + ": layer " + std::to_string(l) + " is in both full_attn_layers and kda_layers");
    if (int64_t(full.size() + kda.size()) != s.n_layers)
      return invalid_argument(lwhere + ": full_attn_layers and kda_layers cover " +
                              std::to_string(full.size() + kda.size()) + " layers, num_hidden_layers is " +
                              std::to_string(s.n_layers));
    s.n_mla_layers = int64_t(full.size());
    s.n_kda_layers = int64_t(kda.size());
    s.kda_heads = MR_TRY(get_int(*lac, "num_heads", lwhere));
    s.kda_head_dim = MR_TRY(get_int(*lac, "head_dim", lwhere));
    s.kda_conv_kernel = get_int_or(*lac, "short_conv_kernel_size", 4);
    s.kda_full_rank_gate = get_bool_or(*lac, "use_full_rank_gate", false);
  } else {
    s.n_mla_layers = s.n_layers;
  }
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

constexpr uint64_t kBf16 = 2, kF32 = 4;

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
  void f32(const std::string& g, Shard s, uint64_t count, uint64_t n) { add(g, s, count, n * kF32); }
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
  const uint64_t w = field("vt_hidden_size", 1024), layers = field("vt_num_hidden_layers", 27),
                 ffn = field("vt_intermediate_size", 4096), qkv = field("qkv_hidden_size", 1536),
                 patch = field("patch_size", 14), pos_h = field("init_pos_emb_height", 64),
                 pos_w = field("init_pos_emb_width", 64), mm = field("mm_hidden_size", int64_t(w));
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
  t.bf16(g, R, 1, text_hidden, 1, est);         // post_norm
}

}  // namespace

WeightBytes weight_bytes_from_config(const PlanModelShape& s) {
  const auto TP = Shard::kTensorParallel, EP = Shard::kExpertParallel, R = Shard::kReplicated;
  const uint64_t H = s.hidden;
  GroupTable t;

  t.bf16("embeddings + lm_head", TP, s.tie_word_embeddings ? 1 : 2, s.vocab, H);
  // Per layer: two RMSNorms and, with Attention Residuals, two (norm, proj) vector pairs.
  t.bf16("norms + attention residuals", R, s.n_layers * 6 + 3, H);

  // Gated MLA: the latent down-projections are small and replicated (every rank needs the
  // whole latent); the per-head up-projections and output are split by heads.
  const uint64_t qk_head = s.qk_nope_head_dim + s.qk_rope_head_dim;
  const uint64_t nh = s.n_heads, nm = s.n_mla_layers;
  const std::string mla = "MLA attention (per-head)", mla_r = "MLA latent down-projections";
  if (s.q_lora_rank > 0) {
    t.bf16(mla_r, R, nm, s.q_lora_rank, H);                 // q_a_proj
    t.bf16(mla_r, R, nm, s.q_lora_rank);                    // q_a_layernorm
    t.bf16(mla, TP, nm, nh * qk_head, s.q_lora_rank);     // q_b_proj
  } else {
    t.bf16(mla, TP, nm, nh * qk_head, H);                 // q_proj
  }
  t.bf16(mla_r, R, nm, s.kv_lora_rank + s.qk_rope_head_dim, H);  // kv_a_proj_with_mqa
  t.bf16(mla_r, R, nm, s.kv_lora_rank);                          // kv_a_layernorm
  t.bf16(mla, TP, nm, nh * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank);  // kv_b_proj
  t.bf16(mla, TP, nm, H, nh * s.v_head_dim);                   // o_proj
  if (s.mla_output_gate) t.bf16(mla, TP, nm, nh * s.v_head_dim, H);  // g_proj

  // KDA: q/k/v/g/o at heads x head_dim, low-rank decay f_a -> f_b, beta per head.
  if (s.n_kda_layers > 0) {
    const uint64_t nk = s.n_kda_layers, P = s.kda_heads * s.kda_head_dim, d = s.kda_head_dim;
    const std::string kda = "KDA attention (per-head)", kda_r = "KDA low-rank gates + o_norm";
    t.bf16(kda, TP, nk * 3, P, H);                     // q_proj, k_proj, v_proj
    t.f32(kda, TP, nk * 3, P * s.kda_conv_kernel);     // q/k/v_conv1d [P, 1, K]
    t.bf16(kda_r, R, nk, d, H);                          // f_a_proj
    t.bf16(kda, TP, nk, P, d);                         // f_b_proj
    t.f32(kda, TP, nk, P);                             // dt_bias
    t.f32(kda, TP, nk, s.kda_heads);                   // A_log
    t.bf16(kda, TP, nk, s.kda_heads, H);               // b_proj
    if (s.kda_full_rank_gate) {
      t.bf16(kda, TP, nk, P, H);                       // g_proj
    } else {
      t.bf16(kda_r, R, nk, d, H);                        // g_a_proj
      t.bf16(kda, TP, nk, P, d);                       // g_b_proj
    }
    t.f32(kda_r, R, nk, d);                              // o_norm
    t.bf16(kda, TP, nk, H, P);                         // o_proj
  }

  if (s.first_k_dense > 0) t.bf16("dense MLP", TP, s.first_k_dense * 3, s.dense_intermediate, H);

  if (s.n_experts > 0) {
    const uint64_t nl = s.n_moe_layers(), E = s.n_experts, I = s.moe_intermediate;
    const uint64_t in = s.latent_moe_hidden > 0 ? s.latent_moe_hidden : H;
    t.bf16("MoE router", R, nl, E, H);                 // gate.weight
    t.f32("MoE router", R, nl, E);                     // e_score_correction_bias
    if (s.n_shared_experts > 0)
      t.bf16("shared experts", TP, nl * 3, s.n_shared_experts * I, H);
    if (s.latent_moe_hidden > 0) {
      t.bf16("LatentMoE down/up projections", TP, nl * 2, s.latent_moe_hidden, H);
      t.bf16("norms + attention residuals", R, nl, s.latent_moe_hidden);  // routed_expert_norm
    }
    // Each expert: w1, w3 [I, in] and w2 [in, I]; the same element count either way.
    const uint64_t n_mats = nl * E * 3, elems = I * in;
    if (s.experts_mxfp4) {
      // weight_packed u8 [out, in/2] (two codes a byte) + weight_scale u8 [out, in/32] (E8M0).
      t.add("routed experts (MXFP4)", EP, n_mats, elems / 2);
      t.add("routed experts (MXFP4)", EP, n_mats, elems / s.mxfp4_group_size);
    } else {
      t.add("routed experts (bf16)", EP, n_mats, elems * kBf16);
    }
  }

  if (s.has_vision) add_vision_tower(t, s.vision_config, int64_t(H));

  WeightBytes wb;
  wb.groups = t.take();
  // safetensors headers: one JSON entry per tensor, ~150 bytes for K3's long expert names
  // ("language_model.model.layers.45.block_sparse_moe.experts.123.w1.weight_packed" with
  // dtype, shape and two 11-digit offsets).
  uint64_t n_tensors = 0;
  for (const auto& g : wb.groups) n_tensors += g.n_tensors;
  wb.file_overhead_bytes = n_tensors * 150;
  wb.exact = false;
  wb.note = "computed from config.json (MXFP4 routed experts, bf16 elsewhere)";
  return wb;
}

Shard shard_of_tensor(const std::string& name) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has(".experts.")) return Shard::kExpertParallel;
  if (name.rfind("vision_tower.", 0) == 0 || name.rfind("mm_projector.", 0) == 0)
    return Shard::kReplicated;
  if (has("norm") || has("_res_") || has(".gate.weight") || has("e_score_correction_bias") ||
      has("q_a_proj") || has("kv_a_proj") || has("f_a_proj") || has("g_a_proj"))
    return Shard::kReplicated;
  return Shard::kTensorParallel;
}

// ---- exact byte count from a checkpoint's headers -------------------------------------

Result<WeightBytes> weight_bytes_from_checkpoint(const std::string& dir) {
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
      const Shard shard = shard_of_tensor(name);
      const bool vision = name.rfind("vision_tower.", 0) == 0 || name.rfind("mm_projector.", 0) == 0;
      const char* group = shard == Shard::kExpertParallel ? "routed experts"
                          : vision                        ? "vision tower + projector"
                          : shard == Shard::kReplicated   ? "norms, router, latent down-projections"
                                                          : "attention, dense, shared experts, embeddings";
      t.add(group, shard, 1, nbytes);
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
