// ModelConfig against the real Kimi K3 config.json and hand-made broken variants.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/weight_spec.h"

namespace moonrun {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The published K3 config.json (a copy of /work/shared/models/kimi-k3.config.json).
std::string k3_config_path() {
  return std::string(MOONRUN_SOURCE_DIR) + "/tests/unit/model/data/kimi-k3.config.json";
}

TEST(ModelConfig, RealK3) {
  auto cfg = load_model_config(k3_config_path());
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->model_type, "kimi_k3");
  EXPECT_EQ(cfg->tensor_prefix, "language_model.model.");
  EXPECT_EQ(cfg->hidden_size, 7168);
  EXPECT_EQ(cfg->num_hidden_layers, 93);
  EXPECT_EQ(cfg->vocab_size, 163840);
  EXPECT_EQ(cfg->bos_token_id, 163584);
  EXPECT_EQ(cfg->eos_token_id, 163586);
  EXPECT_EQ(cfg->pad_token_id, 163839);
  EXPECT_EQ(cfg->media_placeholder_token_id, 163605);
  EXPECT_EQ(cfg->num_mla_layers, 24);
  EXPECT_EQ(cfg->num_kda_layers, 69);
  // 1-based lists: full attention at 4, 8, ..., 92 and 93 -> 0-based 3, 7, ..., 91, 92.
  for (int i = 0; i < 93; ++i) {
    bool mla = (i + 1) % 4 == 0 || i == 92;
    EXPECT_EQ(cfg->layers[i].attn, mla ? LayerKind::mla : LayerKind::kda) << "layer " << i;
    EXPECT_EQ(cfg->layers[i].mlp, i == 0 ? MlpKind::dense : MlpKind::moe) << "layer " << i;
  }
  EXPECT_EQ(cfg->layers[3].mla_index, 0);
  EXPECT_EQ(cfg->layers[92].mla_index, 23);
  EXPECT_EQ(cfg->layers[91].mla_index, 22);
  EXPECT_EQ(cfg->layers[4].kda_index, 3);
  EXPECT_EQ(cfg->hidden_act, Activation::situ);
  EXPECT_FLOAT_EQ(cfg->situ_beta, 4.0f);
  EXPECT_FLOAT_EQ(cfg->situ_linear_beta, 25.0f);
  EXPECT_TRUE(cfg->kda_has_lower_bound);
  EXPECT_FLOAT_EQ(cfg->kda_gate_lower_bound, -5.0f);
  EXPECT_TRUE(cfg->kda_full_rank_gate);
  EXPECT_EQ(cfg->attn_res_block_size, 12);
  EXPECT_EQ(cfg->expert_quant, ExpertQuant::mxfp4_packed);
  EXPECT_EQ(cfg->expert_io_dim(), 3584);
  EXPECT_EQ(cfg->shared_intermediate_size(), 6144);
  EXPECT_EQ(cfg->mla_cache_row(), 576);
}

TEST(WeightNames, RealK3Inventory) {
  auto cfg = load_model_config(k3_config_path());
  ASSERT_TRUE(cfg.is_ok());
  auto tensors = weight_spec(*cfg);
  uint64_t total = 0, expert_bytes = 0;
  int n_packed = 0;
  for (const auto& t : tensors) {
    total += t.nbytes();
    if (t.name.find(".experts.") != std::string::npos) expert_bytes += t.nbytes();
    if (t.name.size() > 14 && t.name.substr(t.name.size() - 14) == ".weight_packed") ++n_packed;
  }
  EXPECT_EQ(n_packed, 92 * 896 * 3);
  // Routed experts: 92 layers x 896 x 3 matrices of 3584x3072 at 4.25 bits (K3_SPEC.md §3).
  EXPECT_EQ(expert_bytes, 92ull * 896 * 3 * (3584ull * 3072 / 2 + 3584ull * 3072 / 32));
  // The release is 1,560,936,091,448 bytes of safetensors, vision tower (~1 GB) and headers
  // included: the text model must account for nearly all of it.
  EXPECT_LT(total, 1560936091448ull);
  EXPECT_GT(total, 1550000000000ull);
  const auto find = [&](const std::string& n) -> const TensorSpec* {
    for (const auto& t : tensors)
      if (t.name == n) return &t;
    return nullptr;
  };
  const auto* a_log = find("language_model.model.layers.0.self_attn.A_log");
  ASSERT_NE(a_log, nullptr);
  EXPECT_EQ(a_log->dtype, DType::F32);
  EXPECT_TRUE(is_alternative_shape(*a_log, {1, 1, 96, 1}));
  EXPECT_FALSE(is_alternative_shape(*a_log, {2, 48}));
  const auto* conv = find("language_model.model.layers.1.self_attn.k_conv1d.weight");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->shape, (std::vector<int64_t>{12288, 1, 4}));
  const auto* bias = find("language_model.model.layers.5.block_sparse_moe.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->dtype, DType::F32);
  const auto* scale = find("language_model.model.layers.5.block_sparse_moe.experts.895.w2.weight_scale");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(scale->shape, (std::vector<int64_t>{3584, 3072 / 32}));
  EXPECT_NE(find("language_model.lm_head.weight"), nullptr);
  EXPECT_NE(find("language_model.model.layers.3.self_attn.kv_a_proj_with_mqa.weight"), nullptr);
  EXPECT_EQ(find("language_model.model.layers.3.self_attn.A_log"), nullptr);
}

// Each broken config gives one line naming the file and the field.
void expect_error(nlohmann::json j, const std::string& fragment) {
  auto cfg = parse_model_config(j, "DIR/config.json");
  ASSERT_FALSE(cfg.is_ok()) << "expected an error mentioning: " << fragment;
  const std::string& m = cfg.status().message();
  EXPECT_NE(m.find(fragment), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_EQ(m.rfind("DIR/config.json: ", 0), 0u) << m;
}

TEST(ModelConfig, ActionableErrors) {
  nlohmann::json k3 = read_json(k3_config_path());
  {
    auto j = k3;
    j["text_config"]["linear_attn_config"]["kda_layers"].push_back(94);
    expect_error(j, "linear_attn_config.kda_layers lists layer 94 but num_hidden_layers is 93");
  }
  {
    auto j = k3;
    j["model_type"] = "llama";
    expect_error(j, "model_type \"llama\" is not supported");
  }
  {
    auto j = k3;
    j["text_config"].erase("hidden_size");
    expect_error(j, "text_config.hidden_size is missing");
  }
  {
    auto j = k3;
    j["text_config"]["hidden_size"] = "big";
    expect_error(j, "text_config.hidden_size must be an integer");
  }
  {
    auto j = k3;
    j["text_config"]["linear_attn_config"]["kda_layers"].push_back(4);
    expect_error(j, "both list layer 4");
  }
  {
    auto j = k3;
    j["text_config"]["num_experts_per_token"] = 1000;
    expect_error(j, "num_experts_per_token");
  }
  {
    auto j = k3;
    j["text_config"]["quantization_config"]["config_groups"]["group_0"]["format"] = "nvfp4-pack-quantized";
    j["text_config"]["quantization_config"]["format"] = "nvfp4-pack-quantized";
    expect_error(j, "nvfp4-pack-quantized");
  }
  {
    auto j = k3;
    j.erase("text_config");
    expect_error(j, "text_config is missing");
  }
}

TEST(ModelConfig, KimiLinearTopLevel) {
  nlohmann::json j = read_json(k3_config_path())["text_config"];
  j["model_type"] = "kimi_linear";
  j["hidden_act"] = "silu";
  j.erase("quantization_config");
  j["linear_attn_config"].erase("gate_lower_bound");
  j["linear_attn_config"]["use_full_rank_gate"] = false;
  j["tie_word_embeddings"] = true;
  j["num_experts"] = 8;
  j["num_experts_per_token"] = 2;
  auto cfg = parse_model_config(j, "DIR/config.json");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->tensor_prefix, "model.");
  EXPECT_EQ(cfg->expert_quant, ExpertQuant::none);
  EXPECT_FALSE(cfg->kda_has_lower_bound);
  EXPECT_EQ(cfg->hidden_act, Activation::silu);
  auto tensors = weight_spec(*cfg);
  bool has_lm_head = false, has_g_a = false;
  for (const auto& t : tensors) {
    has_lm_head |= t.name == "lm_head.weight";
    has_g_a |= t.name == "model.layers.0.self_attn.g_a_proj.weight";
  }
  EXPECT_FALSE(has_lm_head);  // tied to embed_tokens
  EXPECT_TRUE(has_g_a);
}

}  // namespace
}  // namespace moonrun
