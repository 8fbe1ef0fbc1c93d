#include "model/demo_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/dtype.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weight_spec.h"

namespace moonrun {

namespace {

using json = nlohmann::json;
constexpr uint64_t kDemoSeed = 0x4b33'6d6f'6f6e'7275ull;  // "K3moonru"

// splitmix64: portable and fixed (std:: distributions differ across standard libraries).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform() { return 2.0 * uniform01() - 1.0; }                          // [-1, 1)
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The value of element i of tensor t: shaped by what the tensor does, so activations stay
// in a sane range through the layers (random, but not degenerate).
double demo_value(const TensorSpec& t, Rng& rng) {
  const std::string& n = t.name;
  if (ends_with(n, "norm.weight") || ends_with(n, "layernorm.weight")) return 1.0 + 0.1 * rng.uniform();
  if (ends_with(n, "_res_proj.weight")) return 0.5 * rng.uniform();
  if (ends_with(n, ".A_log")) return std::log(1.0 + 15.0 * rng.uniform01());  // log U(1, 16)
  if (ends_with(n, ".dt_bias")) return 0.5 * rng.uniform();
  if (ends_with(n, "conv1d.weight")) return 0.5 * rng.uniform();
  // Wide correction biases keep routing decisions away from ties (K3_SPEC.md §6).
  if (ends_with(n, "e_score_correction_bias")) return 0.5 * rng.uniform();
  if (ends_with(n, "embed_tokens.weight")) return rng.uniform();
  // A [out, in] projection: uniform with variance 1/in.
  const double in = static_cast<double>(t.shape.back());
  return std::sqrt(3.0 / in) * rng.uniform();
}

TensorToWrite make_tensor(const TensorSpec& t) {
  Rng rng{kDemoSeed ^ fnv1a(t.name)};
  TensorToWrite out{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.nbytes())};
  const int64_t n = t.numel();
  if (t.dtype == DType::U8) {
    const bool is_scale = ends_with(t.name, "weight_scale") || ends_with(t.name, "weight_scales");
    if (is_scale) {
      // E8M0 scales: random E2M1 codes have RMS ~2.93; aim the weights at RMS 1/sqrt(in).
      const double in = static_cast<double>(t.shape.back()) * 32;
      const int base = 127 + static_cast<int>(std::lround(-std::log2(2.93 * std::sqrt(in))));
      for (int64_t i = 0; i < n; ++i) out.bytes[i] = static_cast<uint8_t>(base + static_cast<int>(rng.next() % 3) - 1);
    } else {
      for (int64_t i = 0; i < n; ++i) out.bytes[i] = static_cast<uint8_t>(rng.next() & 0xff);
    }
  } else if (t.dtype == DType::F32) {
    for (int64_t i = 0; i < n; ++i) {
      float v = static_cast<float>(demo_value(t, rng));
      std::memcpy(&out.bytes[4 * i], &v, 4);
    }
  } else {
    MR_CHECK(t.dtype == DType::BF16) << t.name;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h = f32_to_bf16(static_cast<float>(demo_value(t, rng)));
      std::memcpy(&out.bytes[2 * i], &h, 2);
    }
  }
  return out;
}

}  // namespace

json demo_model_config(int n_base_tokens) {
  const int vocab = n_base_tokens + kNumReservedSpecialTokens;
  json la = {{"full_attn_layers", {4, 6}},  // 1-based, as in K3: every 4th and the last
             {"kda_layers", {1, 2, 3, 5}},
             {"num_heads", 4},
             {"head_dim", 32},
             {"short_conv_kernel_size", 4},
             {"gate_lower_bound", -5.0},
             {"use_full_rank_gate", true}};
  json quant = {{"quant_method", "compressed-tensors"},
                {"format", "mxfp4-pack-quantized"},
                {"config_groups",
                 {{"group_0",
                   {{"weights", {{"num_bits", 4}, {"group_size", 32}, {"type", "float"}, {"strategy", "group"}}},
                    {"input_activations", nullptr},
                    {"targets", {"Linear"}}}}}},
                {"ignore",
                 {"re:.*shared_experts.*", "re:.*self_attn.*", "re:.*mlp\\..*", "re:.*gate$",
                  "re:.*routed_expert_(down|up)_proj", "lm_head"}}};
  json text = {{"model_type", "kimi_linear"},
               {"architectures", {"KimiLinearForCausalLM"}},
               {"vocab_size", vocab},
               {"hidden_size", 128},
               {"intermediate_size", 256},
               {"num_hidden_layers", 6},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 4},
               {"hidden_act", "situ"},
               {"activation_situ_beta", 4.0},
               {"activation_situ_linear_beta", 25.0},
               {"rms_norm_eps", 1e-5},
               {"max_position_embeddings", 8192},
               {"q_lora_rank", 64},
               {"kv_lora_rank", 64},
               {"qk_nope_head_dim", 32},
               {"qk_rope_head_dim", 16},
               {"v_head_dim", 32},
               {"mla_use_nope", true},
               {"mla_use_output_gate", true},
               {"linear_attn_config", la},
               {"attn_res_block_size", 3},
               {"num_experts", 32},
               {"num_experts_per_token", 4},
               {"num_shared_experts", 1},
               {"moe_intermediate_size", 64},
               {"routed_expert_hidden_size", 64},
               {"latent_moe_use_norm", true},
               {"first_k_dense_replace", 1},
               {"moe_layer_freq", 1},
               {"moe_renormalize", true},
               {"moe_router_activation_func", "sigmoid"},
               {"routed_scaling_factor", 2.5},
               {"use_grouped_topk", true},
               {"num_expert_group", 4},
               {"topk_group", 2},
               {"topk_method", "noaux_tc"},
               {"num_nextn_predict_layers", 0},
               {"bos_token_id", n_base_tokens},
               {"eos_token_id", n_base_tokens + 2},
               {"pad_token_id", n_base_tokens + 255},
               {"tie_word_embeddings", false},
               {"quantization_config", quant}};
  return {{"_note", "moonrun embedded demo model: K3-shaped, random weights (fixed seed), not trained"},
          {"architectures", {"KimiK3ForConditionalGeneration"}},
          {"model_type", "kimi_k3"},
          {"bos_token_id", n_base_tokens},
          {"eos_token_id", n_base_tokens + 2},
          {"pad_token_id", n_base_tokens + 255},
          {"media_placeholder_token_id", n_base_tokens + 21},
          {"tie_word_embeddings", false},
          {"text_config", text}};
}

json demo_tokenizer_config(int n_base_tokens) {
  // K3's named special tokens by offset from the first special id (K3_SPEC.md §4).
  const std::pair<int, const char*> named[] = {
      {0, "[BOS]"},           {1, "[EOS]"},           {2, "<|end_of_msg|>"},   {3, "<|open|>"},
      {4, "<|close|>"},       {5, "<|sep|>"},         {18, "<|media_begin|>"}, {19, "<|media_content|>"},
      {20, "<|media_end|>"},  {21, "<|media_pad|>"},  {254, "[UNK]"},          {255, "[PAD]"}};
  json decoder = json::object();
  for (int k = 0; k < kNumReservedSpecialTokens; ++k) {
    const int id = n_base_tokens + k;
    std::string content = "<|reserved_token_" + std::to_string(id) + "|>";
    for (const auto& [off, name] : named)
      if (off == k) content = name;
    decoder[std::to_string(id)] = {{"content", content}, {"lstrip", false}, {"normalized", false},
                                   {"rstrip", false},    {"single_word", false}, {"special", true}};
  }
  return {{"tokenizer_class", "TikTokenTokenizer"},
          {"auto_map", {{"AutoTokenizer", {"tokenization_kimi.TikTokenTokenizer", nullptr}}}},
          {"bos_token", "[BOS]"},
          {"eos_token", "[EOS]"},
          {"unk_token", "[UNK]"},
          {"pad_token", "[PAD]"},
          {"model_max_length", 8192},
          {"added_tokens_decoder", decoder}};
}

Status write_demo_model(const std::string& dir, int n_base_tokens) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return internal_error(dir + ": cannot create: " + ec.message());
  const json config = demo_model_config(n_base_tokens);
  auto cfg = MR_TRY(parse_model_config(config, dir + "/config.json"));

  auto write_json = [&](const std::string& name, const json& j) -> Status {
    std::ofstream out(dir + "/" + name);
    out << j.dump(1) << "\n";
    return out ? Status::ok() : internal_error(dir + "/" + name + ": write failed");
  };
  MR_RETURN_IF_ERROR(write_json("config.json", config));
  MR_RETURN_IF_ERROR(write_json("tokenizer_config.json", demo_tokenizer_config(n_base_tokens)));

  // Two shards, split at the middle layer, behind an index: the release's layout in small.
  const std::vector<TensorSpec> tensors = weight_spec(cfg);
  const std::string shard_name[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  const std::string second_half = TensorNames(cfg).layer(cfg.num_hidden_layers / 2, "");
  std::vector<TensorToWrite> shard[2];
  json weight_map = json::object();
  uint64_t total_size = 0;
  bool in_second = false;
  for (const auto& t : tensors) {
    in_second = in_second || t.name.rfind(second_half, 0) == 0;
    const int s = in_second ? 1 : 0;
    shard[s].push_back(make_tensor(t));
    weight_map[t.name] = shard_name[s];
    total_size += t.nbytes();
  }
  for (int s = 0; s < 2; ++s)
    MR_RETURN_IF_ERROR(write_safetensors(dir + "/" + shard_name[s], shard[s], json{{"format", "pt"}}));
  return write_json("model.safetensors.index.json",
                    {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}});
}

}  // namespace moonrun
