// The family table (model/families.h) and the K2 row's config, weight listing, verify, plan
// and the INT4 experts' load on the CPU (issue 40). The
// forward itself is checked against the reference in tests/model (fixture k2-tiny).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/families.h"
#include "model/weight_spec.h"
#include "tools/plan.h"
#include "tools/verify.h"

namespace moonrun {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json named(const std::string& model_type, const std::string& arch) {
  json j = json::object();
  if (!model_type.empty()) j["model_type"] = model_type;
  if (!arch.empty()) j["architectures"] = {arch};
  return j;
}

std::string family_of(const json& j) {
  auto row = find_model_family(j, "x/config.json");
  return row.is_ok() ? std::string((*row)->name) + "/" + (*row)->chat_format : "error: " + row.status().message();
}

TEST(ModelFamilies, EachArchitecturePicksItsRow) {
  EXPECT_EQ(family_of(named("kimi_k3", "KimiK3ForConditionalGeneration")), "kimi_k3/kimi_k3");
  EXPECT_EQ(family_of(named("kimi_linear", "KimiLinearForCausalLM")), "kimi_linear/kimi_k2");
  EXPECT_EQ(family_of(named("kimi_k2", "DeepseekV3ForCausalLM")), "kimi_k2/kimi_k2");
  EXPECT_EQ(family_of(named("kimi_k25", "KimiK25ForConditionalGeneration")), "kimi_k2/kimi_k2");
  EXPECT_EQ(family_of(named("deepseek_v3", "DeepseekV3ForCausalLM")), "kimi_k2/kimi_k2");
  // Either name alone is enough.
  EXPECT_EQ(family_of(named("", "DeepseekV3ForCausalLM")), "kimi_k2/kimi_k2");
  EXPECT_EQ(family_of(named("", "KimiK3ForConditionalGeneration")), "kimi_k3/kimi_k3");
  EXPECT_EQ(family_of(named("kimi_k25", "")), "kimi_k2/kimi_k2");
  EXPECT_EQ(family_of(named("kimi_linear", "")), "kimi_linear/kimi_k2");
}

TEST(ModelFamilies, UnknownNamesAreRefusedClearly) {
  auto expect_error = [](const json& j, const std::string& fragment) {
    auto row = find_model_family(j, "x/config.json");
    ASSERT_FALSE(row.is_ok());
    const std::string& m = row.status().message();
    EXPECT_NE(m.find("x/config.json"), std::string::npos) << m;
    EXPECT_NE(m.find(fragment), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  };
  expect_error(named("llama", "LlamaForCausalLM"), "model_type \"llama\" is not supported");
  // The message lists what moonrun runs, K2 included.
  expect_error(named("llama", ""), "kimi_k2 (DeepseekV3ForCausalLM)");
  expect_error(named("", "Qwen3ForCausalLM"), "architecture \"Qwen3ForCausalLM\" is not supported");
  expect_error(json::object(), "model_type and architectures are missing");
  // The two names must agree on the family.
  expect_error(named("kimi_k2", "KimiK3ForConditionalGeneration"), "is a kimi_k3 class but model_type \"kimi_k2\"");
  // parse_model_config goes through the same table.
  auto cfg = parse_model_config(named("llama", ""), "x/config.json");
  ASSERT_FALSE(cfg.is_ok());
  EXPECT_NE(cfg.status().message().find("model_type \"llama\" is not supported"), std::string::npos);
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

const fs::path kK27 = fs::path(MOONRUN_SOURCE_DIR) / "models" / "kimi-k2.7-code.config.json";

TEST(KimiK2Config, TheK27CodeConfigIsTyped) {
  auto c = parse_model_config(read_json(kK27), kK27.string());
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->family, Family::kimi_k2);
  EXPECT_EQ(c->model_type, "kimi_k25");
  EXPECT_EQ(c->architecture, "KimiK25ForConditionalGeneration");
  EXPECT_EQ(c->tensor_prefix, "language_model.model.");
  EXPECT_EQ(c->lm_head_name, "language_model.lm_head.weight");
  EXPECT_EQ(c->num_hidden_layers, 61);
  EXPECT_EQ(c->hidden_size, 7168);
  EXPECT_EQ(c->vocab_size, 163840);
  EXPECT_EQ(c->num_attention_heads, 64);
  EXPECT_EQ(c->q_lora_rank, 1536);
  EXPECT_EQ(c->kv_lora_rank, 512);
  EXPECT_EQ(c->qk_nope_head_dim, 128);
  EXPECT_EQ(c->qk_rope_head_dim, 64);
  EXPECT_EQ(c->v_head_dim, 128);
  EXPECT_FALSE(c->mla_use_output_gate);
  EXPECT_EQ(c->num_mla_layers, 61);
  EXPECT_EQ(c->num_kda_layers, 0);
  EXPECT_EQ(c->attn_res_block_size, 0);
  EXPECT_EQ(c->intermediate_size, 18432);
  EXPECT_EQ(c->first_k_dense_replace, 1);
  EXPECT_EQ(c->layers[0].mlp, MlpKind::dense);
  EXPECT_EQ(c->layers[1].mlp, MlpKind::moe);
  EXPECT_EQ(c->layers[60].mlp, MlpKind::moe);
  EXPECT_EQ(c->num_experts, 384);
  EXPECT_EQ(c->num_experts_per_token, 8);
  EXPECT_EQ(c->num_shared_experts, 1);
  EXPECT_EQ(c->moe_intermediate_size, 2048);
  EXPECT_EQ(c->shared_intermediate_size(), 2048);
  EXPECT_EQ(c->num_expert_group, 1);
  EXPECT_EQ(c->topk_group, 1);
  EXPECT_FLOAT_EQ(c->routed_scaling_factor, 2.827f);
  EXPECT_TRUE(c->moe_renormalize);
  EXPECT_EQ(c->k2.scoring_func, "sigmoid");
  EXPECT_EQ(c->k2.topk_method, "noaux_tc");
  EXPECT_FLOAT_EQ(c->k2.rope_theta, 50000.0f);
  EXPECT_TRUE(c->k2.rope_scaling.yarn);
  EXPECT_FLOAT_EQ(c->k2.rope_scaling.factor, 64.0f);
  EXPECT_EQ(c->k2.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_FLOAT_EQ(c->k2.rope_scaling.beta_fast, 1.0f);
  EXPECT_FLOAT_EQ(c->k2.rope_scaling.mscale_all_dim, 1.0f);
  EXPECT_EQ(c->max_position_embeddings, 262144);
  EXPECT_EQ(c->expert_quant, ExpertQuant::int4_g32_sym);
  EXPECT_TRUE(c->k2.vision_tower);
  EXPECT_EQ(c->bos_token_id, 163584);
  EXPECT_EQ(c->eos_token_id, 163585);
}

// A K2-shaped config small enough to write: flat kimi_k2 (DeepseekV3ForCausalLM) with INT4
// experts, or nested kimi_k25.
json tiny_k2(bool nested) {
  json tc = {
      {"vocab_size", 256},         {"hidden_size", 64},          {"intermediate_size", 128},
      {"moe_intermediate_size", 32}, {"num_hidden_layers", 3},   {"num_attention_heads", 2},
      {"num_key_value_heads", 2},  {"n_shared_experts", 1},      {"n_routed_experts", 8},
      {"num_experts_per_tok", 2},  {"routed_scaling_factor", 2.827}, {"kv_lora_rank", 32},
      {"q_lora_rank", 32},         {"qk_rope_head_dim", 8},      {"v_head_dim", 16},
      {"qk_nope_head_dim", 16},    {"topk_method", "noaux_tc"},  {"n_group", 2},
      {"topk_group", 1},           {"norm_topk_prob", true},     {"scoring_func", "sigmoid"},
      {"first_k_dense_replace", 1}, {"moe_layer_freq", 1},       {"hidden_act", "silu"},
      {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-6}, {"rope_theta", 50000.0},
      {"rope_scaling",
       {{"type", "yarn"}, {"factor", 32.0}, {"original_max_position_embeddings", 128}, {"beta_fast", 1.0},
        {"beta_slow", 1.0}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
      {"tie_word_embeddings", false},
      {"quantization_config",
       {{"quant_method", "compressed-tensors"},
        {"format", "pack-quantized"},
        {"config_groups",
         {{"group_0",
           {{"targets", {"Linear"}},
            {"weights",
             {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"}, {"group_size", 32}}}}}}},
        {"ignore", {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"}}}}};
  if (!nested) {
    tc["architectures"] = {"DeepseekV3ForCausalLM"};
    tc["model_type"] = "kimi_k2";
    return tc;
  }
  return {{"architectures", {"KimiK25ForConditionalGeneration"}},
          {"model_type", "kimi_k25"},
          {"text_config", tc},
          {"vision_config", {{"patch_size", 14}, {"merge_kernel_size", {2, 2}}}}};
}

TEST(KimiK2WeightSpec, DeepseekV3NamesAndInt4Experts) {
  auto c = parse_model_config(tiny_k2(false), "tiny");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  std::map<std::string, TensorSpec> spec;
  for (const TensorSpec& t : weight_spec(*c)) spec.emplace(t.name, t);
  auto expect = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, ShardRule rule) {
    auto it = spec.find(name);
    ASSERT_NE(it, spec.end()) << name;
    EXPECT_EQ(it->second.dtype, dtype) << name;
    EXPECT_EQ(it->second.shape, shape) << name;
    EXPECT_EQ(it->second.shard, rule) << name;
  };
  expect("model.embed_tokens.weight", DType::BF16, {256, 64}, ShardRule::vocab);
  expect("lm_head.weight", DType::BF16, {256, 64}, ShardRule::vocab);
  expect("model.norm.weight", DType::BF16, {64}, ShardRule::replicated);
  expect("model.layers.0.self_attn.q_a_proj.weight", DType::BF16, {32, 64}, ShardRule::replicated);
  expect("model.layers.0.self_attn.q_a_layernorm.weight", DType::BF16, {32}, ShardRule::replicated);
  expect("model.layers.0.self_attn.q_b_proj.weight", DType::BF16, {2 * 24, 32}, ShardRule::column);
  expect("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", DType::BF16, {32 + 8, 64}, ShardRule::replicated);
  expect("model.layers.0.self_attn.kv_a_layernorm.weight", DType::BF16, {32}, ShardRule::replicated);
  expect("model.layers.0.self_attn.kv_b_proj.weight", DType::BF16, {2 * 32, 32}, ShardRule::column);
  expect("model.layers.0.self_attn.o_proj.weight", DType::BF16, {64, 2 * 16}, ShardRule::row);
  EXPECT_EQ(spec.count("model.layers.0.self_attn.g_proj.weight"), 0u);  // no output gate
  expect("model.layers.0.mlp.gate_proj.weight", DType::BF16, {128, 64}, ShardRule::column);
  expect("model.layers.0.mlp.down_proj.weight", DType::BF16, {64, 128}, ShardRule::row);
  expect("model.layers.1.mlp.gate.weight", DType::BF16, {8, 64}, ShardRule::replicated);
  expect("model.layers.1.mlp.gate.e_score_correction_bias", DType::F32, {8}, ShardRule::replicated);
  expect("model.layers.1.mlp.shared_experts.up_proj.weight", DType::BF16, {32, 64}, ShardRule::column);
  expect("model.layers.1.mlp.shared_experts.down_proj.weight", DType::BF16, {64, 32}, ShardRule::row);
  expect("model.layers.2.mlp.experts.7.gate_proj.weight_packed", DType::I32, {32, 64 / 8}, ShardRule::expert);
  expect("model.layers.2.mlp.experts.7.gate_proj.weight_scale", DType::BF16, {32, 64 / 32}, ShardRule::expert);
  expect("model.layers.2.mlp.experts.7.gate_proj.weight_shape", DType::I64, {2}, ShardRule::expert);
  expect("model.layers.2.mlp.experts.0.down_proj.weight_packed", DType::I32, {64, 32 / 8}, ShardRule::expert);
  expect("model.layers.2.mlp.experts.0.up_proj.weight_scale", DType::BF16, {32, 64 / 32}, ShardRule::expert);
  EXPECT_EQ(spec.count("model.layers.0.mlp.gate.weight"), 0u);  // layer 0 is dense
  // 1 embed + 1 lm_head + 1 norm + 3 x (2 norms + 7 MLA) + 3 dense + 2 x (2 router + 3 shared
  // + 8 experts x 3 matrices x 3 parts).
  EXPECT_EQ(spec.size(), 3u + 3 * 9 + 3 + 2 * (2 + 3 + 8 * 3 * 3));

  auto n = parse_model_config(tiny_k2(true), "tiny");
  ASSERT_TRUE(n.is_ok()) << n.status().message();
  std::set<std::string> nested;
  for (const TensorSpec& t : weight_spec(*n)) nested.insert(t.name);
  EXPECT_EQ(nested.size(), spec.size());
  EXPECT_TRUE(nested.count("language_model.model.layers.2.mlp.experts.3.up_proj.weight_packed"));
  EXPECT_TRUE(nested.count("language_model.lm_head.weight"));
}

TEST(KimiK2Config, ErrorsNameTheField) {
  auto expect_error = [](json j, const std::string& fragment) {
    auto c = parse_model_config(j, "x/config.json");
    ASSERT_FALSE(c.is_ok()) << fragment;
    EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status().message();
  };
  {
    json j = tiny_k2(false);
    j["scoring_func"] = "softmax";
    expect_error(j, "x/config.json: scoring_func \"softmax\" is not supported");
  }
  {
    json j = tiny_k2(false);
    j["rope_scaling"]["type"] = "longrope";
    expect_error(j, "rope_scaling: type \"longrope\" is not supported");
  }
  {
    json j = tiny_k2(true);
    j["text_config"].erase("n_routed_experts");
    j["text_config"]["first_k_dense_replace"] = 0;
    j["text_config"].erase("intermediate_size");
    expect_error(j, "text_config.intermediate_size is needed");
  }
  {
    json j = tiny_k2(false);
    j["n_group"] = 3;
    expect_error(j, "n_group 3 does not divide n_routed_experts 8");
  }
  {
    json j = tiny_k2(false);
    j["quantization_config"]["format"] = "mxfp4-pack-quantized";
    expect_error(j, "are not a K2 layout");
  }
  {
    json j = tiny_k2(true);
    j.erase("text_config");
    expect_error(j, "text_config is missing");
  }
}

// Writes every tensor of `cfg`'s listing into DIR/model.safetensors (zero bytes; a
// weight_shape holds its [out, in]), with `config` as DIR/config.json. `bad` names one
// tensor to store with its last dimension one larger.
void write_checkpoint(const fs::path& dir, const json& config, const std::string& bad = "") {
  fs::remove_all(dir);
  fs::create_directories(dir);
  { std::ofstream(dir / "config.json") << config.dump(2); }
  auto cfg = parse_model_config(config, (dir / "config.json").string());
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().message();
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& t : weight_spec(*cfg)) {
    TensorToWrite w{t.name, t.dtype, t.shape, {}};
    if (t.name == bad) ++w.shape.back();
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    w.bytes.assign(static_cast<size_t>(n) * dtype_size_bytes(t.dtype), 0);
    tensors.push_back(std::move(w));
  }
  ASSERT_TRUE(write_safetensors((dir / "model.safetensors").string(), tensors).is_ok());
}

VerifyReport verify_dir(const fs::path& dir) {
  VerifyOptions opt;
  opt.model = dir.string();
  opt.progress = nullptr;
  auto r = verify_checkpoint(opt);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? *r : VerifyReport{};
}

fs::path temp_dir(const std::string& name) {
  return fs::temp_directory_path() / ("moonrun_k2_" + name + "_" + std::to_string(getpid()));
}

TEST(KimiK2Verify, ASyntheticCheckpointPasses) {
  for (bool nested : {false, true}) {
    const fs::path dir = temp_dir(nested ? "k25" : "k2");
    write_checkpoint(dir, tiny_k2(nested));
    VerifyReport r = verify_dir(dir);
    EXPECT_TRUE(r.complete()) << (r.problems.empty() ? "" : r.problems[0]);
    const size_t n = 3 + 3 * 9 + 3 + 2 * (2 + 3 + 8 * 3 * 3);
    EXPECT_EQ(r.config_check, std::to_string(n) + "/" + std::to_string(n) + " tensors match config.json (" +
                                  (nested ? "kimi_k25" : "kimi_k2") + ")");
    fs::remove_all(dir);
  }
}

TEST(KimiK2Verify, AWrongShapedPackedWeightIsNamed) {
  const fs::path dir = temp_dir("bad");
  const std::string bad = "model.layers.2.mlp.experts.5.down_proj.weight_packed";
  write_checkpoint(dir, tiny_k2(false), bad);
  VerifyReport r = verify_dir(dir);
  ASSERT_FALSE(r.complete());
  bool named = false;
  for (const auto& p : r.problems)
    if (p.find("tensor " + bad + " has dtype I32 and shape [64, 5], expected I32 [64, 4]") != std::string::npos)
      named = true;
  EXPECT_TRUE(named) << r.problems[0];
  fs::remove_all(dir);
}

// `moonrun generate` (the same load_model as `serve`) on a K2 checkpoint with INT4 experts
// on the CPU: the family lets it through to the loader (issue 40), which reads every
// expert's weight_shape and names the first that disagrees with config.json, in one line
// (this checkpoint is all zeros). The forward over real INT4 experts is checked against the
// reference in tests/model (fixture k2-tiny-int4).
TEST(KimiK2Load, Int4ExpertsLoadOnTheCpuAndAWrongWeightShapeIsOneLine) {
  const fs::path dir = temp_dir("load");
  write_checkpoint(dir, tiny_k2(false));
  const std::string err_file = (dir / "err.txt").string();
  const std::string cmd = std::string(MOONRUN_EXE) + " generate --device cpu --model " + dir.string() +
                          " --token-ids 1,2 --max-tokens 1 2>" + err_file;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t k = fread(buf, 1, sizeof(buf), p)) out.append(buf, k);
  const int st = pclose(p);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_NE(WEXITSTATUS(st), 0);
  std::ifstream e(err_file);
  const std::string err((std::istreambuf_iterator<char>(e)), {});
  EXPECT_EQ(err.find('\n'), err.size() - 1) << err;  // exactly one line
  EXPECT_NE(err.find("model.layers.1.mlp.experts.0.gate_proj.weight_shape says [0, 0], expected [32, 64]"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("not built yet"), std::string::npos) << err;
  fs::remove_all(dir);
}

// `moonrun plan` for Kimi K2.7 Code (models/kimi-k2.7-code.config.json) against hand
// arithmetic from the config (bf16 = 2 bytes; INT4 experts: 4 bits + a bf16 scale per 32
// elements + a 16-byte int64 weight_shape per matrix):
//   embeddings + lm_head   2 x 163840 x 7168                      =  2,348,810,240 params
//   norms                  61 x 2 x 7168 + 7168                   =        881,664
//   MLA per layer          q_a 1536x7168 + q_a_ln 1536 + q_b (64x192)x1536 + kv_a 576x7168
//                          + kv_a_ln 512 + kv_b (64x256)x512 + o 7168x(64x128) = 101,124,096
//                          x 61                                   =  6,168,569,856
//   dense layer 0          3 x 18432 x 7168                       =    396,361,728
//   MoE layers 1..60       router 384x7168 + shared 3x2048x7168   = 46,792,704 x 60 = 2,807,562,240
//   -> bf16 params 11,722,185,728 = 23,444,371,456 bytes; e_score_correction_bias fp32
//      60 x 384 x 4 = 92,160 bytes.
//   routed experts         60 x 384 x 3 matrices of 2048 x 7168 (14,680,064 elements):
//                          7,340,032 packed + 917,504 scale + 16 shape = 8,257,552 bytes
//                          x 69,120 matrices                      = 570,761,994,240 bytes
//   (1.0147 T expert params + 11.72 B others = 1.03 T; active 11.72 B + 8 x 3 x 14.68 M x 60
//    = 32.86 B: the guide's "1 T parameters, 32 B active".)
// Per GPU at TP 8 = EP 8: replicated (norms, q_a, q_a_ln, kv_a, kv_a_ln, router, bias)
//   2 x (881,664 + 61 x 15,140,864 + 60 x 2,752,512) + 92,160 = 2,179,342,336
//   + TP share (23,444,371,456 - 2,179,250,176) / 8            = 2,658,140,160
//   + EP share 570,761,994,240 / 8                             = 71,345,249,280
//   = 76,182,731,776 bytes of the text model (+ the vision tower, replicated, estimated).
TEST(KimiK2Plan, K27CodeOnEightH200MatchesTheArithmetic) {
  auto m = tools::load_plan_model(kK27.string());
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  uint64_t experts = 0, text = 0, vision = 0;
  for (const auto& g : m->weights.groups) {
    if (g.name == "routed experts (INT4)") experts += g.bytes;
    if (g.name == "vision tower + projector") vision += g.bytes;
    else text += g.bytes;
  }
  EXPECT_EQ(experts, 570'761'994'240ull);
  EXPECT_EQ(text, 23'444'371'456ull + 92'160 + 570'761'994'240ull);
  EXPECT_EQ(m->weights.bytes_of(tools::Shard::kExpertParallel), 570'761'994'240ull);

  // The loader's own per-rank sum (rank_weight_bytes) gives the same text share.
  const ParallelRank rank{3, 8, 8};
  EXPECT_EQ(rank_weight_bytes(m->shape.config, rank), 76'182'731'776ull);

  tools::PlanInputs in;
  in.shape = m->shape;
  in.weights = m->weights;
  in.gpu = *tools::find_gpu("H200");
  in.gpus_per_node = 8;
  in.nodes = 1;
  auto p = tools::make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->tp, 8);
  EXPECT_EQ(p->experts_per_gpu, 48);
  EXPECT_EQ(p->weights_per_gpu_bytes, 76'182'731'776ull + vision);
  EXPECT_TRUE(p->fits);
  // The guide: a 595.18 GB checkpoint, about 443 GB left on 8 x H200 under the 92 % rule
  // (0.92 x 1,128 GB - 595.18 GB = 442.58 GB). The config-only figure adds an estimated
  // vision tower and safetensors headers to the exact text bytes above.
  EXPECT_NEAR(double(p->checkpoint_bytes), 595.18e9, 1.5e9);
  EXPECT_NEAR(double(p->vm_rule_left_bytes), 443e9, 1.5e9);
  // MLA keeps kv_lora + rope = 576 values per token per layer: 61 x 576 x 2 bytes.
  EXPECT_EQ(p->kv_bytes_per_token, 61u * 576 * 2);
}

}  // namespace
}  // namespace moonrun
