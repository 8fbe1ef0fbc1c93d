#include "model/demo_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/dtype.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/synthetic_weights.h"
#include "model/weight_spec.h"

namespace moonrun {

namespace {

using json = nlohmann::json;
constexpr uint64_t kDemoSeed = 0x4b33'6d6f'6f6e'7275ull;  // "K3moonru"

TensorToWrite make_tensor(const TensorSpec& t) {
  TensorToWrite out{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.nbytes())};
  synthetic_bytes(t, kDemoSeed, 0, t.numel(), out.bytes.data());
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
  return {{"_note", "moonrun random K3-shaped checkpoint (make-demo-model): random weights (fixed seed), not trained"},
          {"architectures", {"KimiK3ForConditionalGeneration"}},
          {"model_type", "kimi_k3"},
          {"bos_token_id", n_base_tokens},
          {"eos_token_id", n_base_tokens + 2},
          {"pad_token_id", n_base_tokens + 255},
          {"media_placeholder_token_id", n_base_tokens + 21},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"text_config", text},
          // A small MoonViT-V2 (K3's layout: RMSNorm, tanh-GELU MLP, 2-D RoPE, 2x2 merge,
          // patchmergerv2 projector) so images take the whole path: 128 x 128 -> 25 rows.
          {"vision_config", {{"patch_size", 14},
                             {"merge_kernel_size", {2, 2}},
                             {"init_pos_emb_height", 16},
                             {"init_pos_emb_width", 16},
                             {"init_pos_emb_time", 4},
                             {"pos_emb_type", "divided_fixed"},
                             {"vt_num_attention_heads", 2},
                             {"vt_num_hidden_layers", 2},
                             {"vt_hidden_size", 64},
                             {"vt_intermediate_size", 128},
                             {"qkv_hidden_size", 64},
                             {"merge_type", "sd2_tpool"},
                             {"mm_projector_type", "patchmergerv2"},
                             {"mm_hidden_size", 64},
                             {"projector_hidden_act", "gelu"},
                             {"projector_ln_eps", 1e-5},
                             {"text_hidden_size", 128},
                             {"media_placeholder_token_id", n_base_tokens + 21}}}};
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
