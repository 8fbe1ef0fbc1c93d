#include "tools/make_slice.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/synthetic_weights.h"
#include "model/weight_spec.h"
#include "tools/kimi_k3_config.h"

namespace moonrun::tools {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The text config inside a config.json: K3's nested text_config, or the top level.
json& text_config(json& config) { return config.contains("text_config") ? config["text_config"] : config; }

// Rewrites the text config for the listed layers.
Status shape_config(json& config, const SliceConfig& c) {
  json& text = text_config(config);
  std::vector<int> kda, mla;
  int dense = 0;
  bool seen_moe = false;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const std::string& l = c.layers[i];
    const size_t dash = l.find('-');
    const std::string attn = l.substr(0, dash), mlp = dash == std::string::npos ? "" : l.substr(dash + 1);
    if ((attn != "kda" && attn != "mla") || (mlp != "dense" && mlp != "moe"))
      return invalid_argument("--layers: \"" + l + "\" is not one of kda-dense, kda-moe, mla-dense, mla-moe");
    (attn == "kda" ? kda : mla).push_back(static_cast<int>(i) + 1);  // 1-based, as the release lists them
    if (mlp == "dense") {
      if (seen_moe)
        return invalid_argument("--layers: dense layers come first (the config's first_k_dense_replace), \"" + l +
                                "\" follows a MoE layer");
      ++dense;
    } else {
      seen_moe = true;
    }
  }
  text["num_hidden_layers"] = static_cast<int>(c.layers.size());
  text["first_k_dense_replace"] = dense;
  if (text.contains("linear_attn_config") && text["linear_attn_config"].is_object()) {
    text["linear_attn_config"]["kda_layers"] = kda;
    text["linear_attn_config"]["full_attn_layers"] = mla;
    // K3.1: its DSA layers are exactly the full-attention ones.
    if (text.contains("dsa_config") && text["dsa_config"].is_object()) text["dsa_config"]["dsa_layers"] = mla;
  } else if (!kda.empty()) {
    // The DeepSeek-V3 layout (Kimi K2): every layer is MLA.
    return invalid_argument(c.config_path + ": no linear_attn_config (a Kimi K2 / DeepSeek-V3 layout), so no kda layers");
  }
  if (c.num_experts > 0) {
    // K3's key names, or DeepSeek-V3's (K2).
    const bool deepseek = text.contains("n_routed_experts");
    const char* experts = deepseek ? "n_routed_experts" : "num_experts";
    const char* per_token = deepseek ? "num_experts_per_tok" : "num_experts_per_token";
    const char* group = deepseek ? "n_group" : "num_expert_group";
    text[experts] = c.num_experts;
    if (text.value(per_token, 0) > c.num_experts) text[per_token] = c.num_experts;
    // Grouped routing needs whole groups: fall back to plain top-k when they do not divide.
    const int groups = text.value(group, 1);
    if (groups > 1 && c.num_experts % groups != 0) {
      text[group] = 1;
      text["topk_group"] = 1;
    }
  }
  return Status::ok();
}

// One safetensors header for `tensors` (data offsets back to back), padded to 8 bytes.
std::string header_of(const std::vector<TensorSpec>& tensors) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    h[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string s = h.dump();
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

// Streams one tensor's synthetic bytes to f, chunk by chunk, each chunk filled by every thread.
// An INT4 expert's weight_shape is no random draw: the loader checks it against the layout,
// [out, in] of its weight_packed sibling ([out, in / 8] int32 words).
bool write_tensor(std::FILE* f, const TensorSpec& t, uint64_t seed, int threads, std::vector<uint8_t>& buf,
                  const std::vector<TensorSpec>& all) {
  static const std::string kShape = "weight_shape";
  if (t.dtype == DType::I64 && t.name.size() > kShape.size() &&
      t.name.compare(t.name.size() - kShape.size(), kShape.size(), kShape) == 0) {
    const std::string packed = t.name.substr(0, t.name.size() - kShape.size()) + "weight_packed";
    const auto it = std::find_if(all.begin(), all.end(), [&](const TensorSpec& s) { return s.name == packed; });
    if (it == all.end() || it->shape.size() != 2 || t.numel() != 2) return false;
    const int64_t shape[2] = {it->shape[0], it->shape[1] * 8};
    return std::fwrite(shape, 1, sizeof shape, f) == sizeof shape;
  }
  const int64_t elem = static_cast<int64_t>(dtype_size_bytes(t.dtype));
  const int64_t chunk = static_cast<int64_t>(buf.size()) / elem, n = t.numel();
  for (int64_t first = 0; first < n; first += chunk) {
    const int64_t count = std::min(chunk, n - first);
    const int64_t per = (count + threads - 1) / threads;
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k) {
      const int64_t b = k * per, e = std::min(count, b + per);
      if (b >= e) break;
      // Balanced router biases: a batch touches as many experts as the floor counts.
      pool.emplace_back(
          [&, b, e] { synthetic_bytes(t, seed, first + b, e - b, buf.data() + b * elem, RouterBias::balanced); });
    }
    for (auto& th : pool) th.join();
    if (std::fwrite(buf.data(), 1, static_cast<size_t>(count * elem), f) != static_cast<size_t>(count * elem))
      return false;
  }
  return true;
}

}  // namespace

Result<SliceReport> make_slice(const SliceConfig& c) {
  const auto t0 = std::chrono::steady_clock::now();
  if (c.layers.empty()) return invalid_argument("--layers: at least one layer");
  json config;
  if (c.config_path == "kimi-k3") {
    config = json::parse(kimi_k3_config_json(), nullptr, /*allow_exceptions=*/false);
  } else {
    std::ifstream in(c.config_path);
    if (!in) return not_found(c.config_path + ": cannot open");
    config = json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  if (config.is_discarded() || !config.is_object()) return invalid_argument(c.config_path + ": not a JSON object");
  MR_RETURN_IF_ERROR(shape_config(config, c));
  const ModelConfig cfg = MR_TRY(parse_model_config(config, c.config_path));
  const std::vector<TensorSpec> spec = weight_spec(cfg);

  std::error_code ec;
  fs::create_directories(c.out_dir, ec);
  if (ec) return not_found(c.out_dir + ": cannot create: " + ec.message());
  // Shards of about shard_bytes, in the listing's order.
  std::vector<std::vector<TensorSpec>> shards(1);
  uint64_t in_shard = 0;
  for (const TensorSpec& t : spec) {
    if (in_shard > 0 && in_shard + t.nbytes() > c.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.nbytes();
  }
  const int threads = c.threads > 0 ? c.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<uint8_t> buf(size_t{64} << 20);
  SliceReport report;
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string path = c.out_dir + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return not_found(path + ": cannot create: " + std::strerror(errno));
    const std::string header = header_of(shards[s]);
    uint8_t len_le[8];
    for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
    bool ok = std::fwrite(len_le, 1, 8, f) == 8 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
    for (const TensorSpec& t : shards[s]) {
      ok = ok && write_tensor(f, t, c.seed, threads, buf, spec);
      weight_map[t.name] = name;
      report.bytes += t.nbytes();
      ++report.tensors;
    }
    ok = std::fclose(f) == 0 && ok;
    if (!ok) return data_loss(path + ": write failed (disk full?)");
  }
  report.shards = static_cast<int>(shards.size());
  std::ofstream(c.out_dir + "/config.json") << config.dump(1) << "\n";
  std::ofstream(c.out_dir + "/model.safetensors.index.json")
      << json{{"metadata", {{"total_size", report.bytes}}}, {"weight_map", weight_map}}.dump(1) << "\n";
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace moonrun::tools
