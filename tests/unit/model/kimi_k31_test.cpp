// The K3.1 row of the family table (issue 38, step 1): Kimi K3.1-Pro's config (K3's plus a
// dsa_config), the DSA indexer's tensors in the weight listing, verify on a synthetic K3.1
// checkpoint, plan's cache bytes (latent rows + indexer keys) and weight totals, and generate
// running the forward.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
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
#include "tools/kimi_k3_config.h"
#include "tools/plan.h"
#include "tools/verify.h"

namespace moonrun {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kSource = fs::path(MOONRUN_SOURCE_DIR);
const fs::path kDemo = kSource / "models" / "moonrun-demo";
const fs::path kPro = kSource / "models" / "kimi-k3.1-pro.config.json";

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// The demo model's K3 config (8 layers, full attention at 4 and 8, q_lora_rank 128) made a
// K3.1 one: indexer 4 heads x 32, top 16.
json tiny_k31() {
  json j = read_json(kDemo / "config.json");
  j["architectures"] = {"KimiK31ForConditionalGeneration"};
  j["model_type"] = "kimi_k31";
  j["text_config"]["dsa_config"] = {
      {"dsa_layers", {4, 8}}, {"index_n_heads", 4}, {"index_head_dim", 32}, {"index_topk", 16}};
  return j;
}

std::string family_of(const json& j) {
  auto row = find_model_family(j, "x/config.json");
  return row.is_ok() ? std::string((*row)->name) + "/" + (*row)->chat_format : "error: " + row.status().message();
}

json named(const std::string& model_type, const std::string& arch) {
  json j = json::object();
  if (!model_type.empty()) j["model_type"] = model_type;
  if (!arch.empty()) j["architectures"] = {arch};
  return j;
}

TEST(KimiK31Family, BothNamesPickTheRowWithK3sChatFormat) {
  EXPECT_EQ(family_of(named("kimi_k31", "KimiK31ForConditionalGeneration")), "kimi_k31/kimi_k3");
  EXPECT_EQ(family_of(named("", "KimiK31ForConditionalGeneration")), "kimi_k31/kimi_k3");
  EXPECT_EQ(family_of(named("kimi_k31", "")), "kimi_k31/kimi_k3");
  const std::string conflict = family_of(named("kimi_k3", "KimiK31ForConditionalGeneration"));
  EXPECT_NE(conflict.find("is a kimi_k31 class but model_type \"kimi_k3\""), std::string::npos) << conflict;
  EXPECT_NE(family_of(named("llama", "")).find("kimi_k31 (KimiK31ForConditionalGeneration)"), std::string::npos);
}

TEST(KimiK31Config, TheProConfigIsK3PlusTheIndexer) {
  auto c = parse_model_config(read_json(kPro), kPro.string());
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->family, Family::kimi_k31);
  EXPECT_EQ(c->architecture, "KimiK31ForConditionalGeneration");
  EXPECT_EQ(c->model_type, "kimi_k31");
  EXPECT_EQ(c->tensor_prefix, "language_model.model.");
  EXPECT_EQ(c->num_hidden_layers, 93);
  EXPECT_EQ(c->num_mla_layers, 24);
  EXPECT_EQ(c->num_kda_layers, 69);
  EXPECT_EQ(c->num_dsa_layers, 24);
  EXPECT_EQ(c->dsa.index_n_heads, 32);
  EXPECT_EQ(c->dsa.index_head_dim, 128);
  EXPECT_EQ(c->dsa.index_topk, 2048);
  EXPECT_FLOAT_EQ(c->dsa.k_norm_eps, 1e-5f);  // rms_norm_eps: the config declares no eps of its own
  EXPECT_EQ(c->dsa.key_cache_bytes(), 128 + 4);
  // 1-based 4 and 93 are layers 3 and 92: the first and last DSA layers; KDA layers have none.
  EXPECT_EQ(c->layers[3].dsa_index, 0);
  EXPECT_EQ(c->layers[92].dsa_index, 23);
  EXPECT_EQ(c->layers[0].dsa_index, -1);
  EXPECT_EQ(c->layers[0].attn, LayerKind::kda);
  // The file is the built-in `plan --model kimi-k3.1-pro` config written out.
  EXPECT_EQ(read_json(kPro), tools::kimi_k31_pro_config());
  // K3 itself has no indexer.
  auto k3 = parse_model_config(json::parse(tools::kimi_k3_config_json()), "k3");
  ASSERT_TRUE(k3.is_ok());
  EXPECT_EQ(k3->num_dsa_layers, 0);
}

TEST(KimiK31Config, EveryBadDsaConfigIsOneClearLine) {
  auto expect_error = [](const json& j, const std::string& fragment) {
    auto c = parse_model_config(j, "x/config.json");
    ASSERT_FALSE(c.is_ok()) << fragment;
    const std::string& m = c.status().message();
    EXPECT_EQ(m.rfind("x/config.json: ", 0), 0u) << m;
    EXPECT_NE(m.find(fragment), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  };
  auto with = [](const std::function<void(json& dc)>& edit) {
    json j = tiny_k31();
    edit(j["text_config"]["dsa_config"]);
    return j;
  };
  {
    json j = tiny_k31();
    j["text_config"].erase("dsa_config");
    expect_error(j, "text_config.dsa_config is missing");
  }
  expect_error(with([](json& d) { d = json::array(); }), "text_config.dsa_config must be an object");
  expect_error(with([](json& d) { d.erase("dsa_layers"); }), "text_config.dsa_config.dsa_layers is missing");
  expect_error(with([](json& d) { d["dsa_layers"] = 4; }), "dsa_config.dsa_layers must be a list of 1-based layer");
  expect_error(with([](json& d) { d["dsa_layers"] = {4, "8"}; }), "dsa_config.dsa_layers must hold integers");
  // 0-based by mistake: layer 0 is out of range, and 3 / 7 are KDA layers.
  expect_error(with([](json& d) { d["dsa_layers"] = {0, 3}; }), "lists layer 0 but num_hidden_layers is 8 (the lists are 1-based)");
  expect_error(with([](json& d) { d["dsa_layers"] = {3, 7}; }),
               "dsa_config.dsa_layers lists layer(s) 3, 7 that linear_attn_config makes KDA layers");
  expect_error(with([](json& d) { d["dsa_layers"] = {4, 9}; }), "lists layer 9 but num_hidden_layers is 8");
  expect_error(with([](json& d) { d["dsa_layers"] = {4}; }),
               "dsa_config.dsa_layers leaves out full-attention layer(s) 8 (the DSA layers are exactly the "
               "full-attention layers, 1-based)");
  expect_error(with([](json& d) { d["dsa_layers"] = {4, 8, 4}; }), "dsa_config.dsa_layers lists layer 4 twice");
  expect_error(with([](json& d) { d.erase("index_n_heads"); }), "dsa_config.index_n_heads is missing");
  expect_error(with([](json& d) { d["index_n_heads"] = 0; }), "dsa_config.index_n_heads must be positive, got 0");
  expect_error(with([](json& d) { d["index_head_dim"] = "128"; }), "dsa_config.index_head_dim must be an integer");
  expect_error(with([](json& d) { d.erase("index_topk"); }), "dsa_config.index_topk is missing");
  expect_error(with([](json& d) { d["index_topk"] = -2048; }), "dsa_config.index_topk must be positive");
  {
    json j = tiny_k31();
    j["text_config"]["q_lora_rank"] = nullptr;
    expect_error(j, "q_lora_rank is null but the DSA indexer's wq_b reads the query latent");
  }
}

TEST(KimiK31WeightSpec, FourIndexerTensorsPerDsaLayerAllReplicated) {
  auto c = parse_model_config(tiny_k31(), "tiny");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  std::map<std::string, TensorSpec> spec;
  for (const TensorSpec& t : weight_spec(*c)) spec.emplace(t.name, t);
  auto expect = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = spec.find(name);
    ASSERT_NE(it, spec.end()) << name;
    EXPECT_EQ(it->second.dtype, DType::BF16) << name;
    EXPECT_EQ(it->second.shape, shape) << name;
    EXPECT_EQ(it->second.shard, ShardRule::replicated) << name;
  };
  for (int layer : {3, 7}) {  // 1-based 4 and 8
    const std::string p = "language_model.model.layers." + std::to_string(layer) + ".self_attn.indexer.";
    expect(p + "wq_b.weight", {4 * 32, 128});  // [n_heads x head_dim, q_lora_rank]
    expect(p + "wk.weight", {32, 256});        // [head_dim, hidden]
    expect(p + "k_norm.weight", {32});         // LayerNorm weight and bias
    expect(p + "k_norm.bias", {32});
    expect(p + "weights_proj.weight", {4, 256});  // [n_heads, hidden]
  }
  size_t indexer = 0;
  for (const auto& [name, t] : spec)
    if (name.find(".indexer.") != std::string::npos) ++indexer;
  EXPECT_EQ(indexer, 2u * 5);
  // Everything else is K3's listing, unchanged.
  json k3 = read_json(kDemo / "config.json");
  auto c3 = parse_model_config(k3, "k3");
  ASSERT_TRUE(c3.is_ok());
  EXPECT_EQ(spec.size(), weight_spec(*c3).size() + 10);
  // The MLA projections of a DSA layer stay K3's (gated, TP by heads).
  EXPECT_EQ(spec.at("language_model.model.layers.3.self_attn.q_b_proj.weight").shard, ShardRule::column);
  EXPECT_EQ(spec.count("language_model.model.layers.2.self_attn.indexer.wk.weight"), 0u);  // a KDA layer
}

// Writes every tensor of `config`'s listing (zeros) into DIR/model.safetensors, with the
// demo model's tokenizer beside it. `bad` is stored with its last dimension one larger;
// `drop` is left out.
void write_checkpoint(const fs::path& dir, const json& config, const std::string& bad = "",
                      const std::string& drop = "") {
  fs::remove_all(dir);
  fs::create_directories(dir);
  { std::ofstream(dir / "config.json") << config.dump(2); }
  for (const char* f : {"tiktoken.model", "tokenizer_config.json"}) fs::copy_file(kDemo / f, dir / f);
  auto cfg = parse_model_config(config, (dir / "config.json").string());
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().message();
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& t : weight_spec(*cfg)) {
    if (t.name == drop) continue;
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
  return fs::temp_directory_path() / ("moonrun_k31_" + name + "_" + std::to_string(getpid()));
}

bool has_problem(const VerifyReport& r, const std::string& fragment) {
  for (const auto& p : r.problems)
    if (p.find(fragment) != std::string::npos) return true;
  return false;
}

TEST(KimiK31Verify, ASyntheticCheckpointPassesAndIndexerFaultsAreNamed) {
  auto c = parse_model_config(tiny_k31(), "tiny");
  ASSERT_TRUE(c.is_ok());
  const size_t n = weight_spec(*c).size();
  const fs::path dir = temp_dir("verify");
  write_checkpoint(dir, tiny_k31());
  VerifyReport ok = verify_dir(dir);
  EXPECT_TRUE(ok.complete()) << (ok.problems.empty() ? "" : ok.problems[0]);
  EXPECT_EQ(ok.config_check, std::to_string(n) + "/" + std::to_string(n) + " tensors match config.json (kimi_k31)");

  const std::string wq_b = "language_model.model.layers.7.self_attn.indexer.wq_b.weight";
  write_checkpoint(dir, tiny_k31(), wq_b);
  VerifyReport bad = verify_dir(dir);
  ASSERT_FALSE(bad.complete());
  EXPECT_TRUE(has_problem(bad, "tensor " + wq_b + " has dtype BF16 and shape [128, 129], expected BF16 [128, 128]"))
      << bad.problems[0];

  const std::string k_norm_bias = "language_model.model.layers.3.self_attn.indexer.k_norm.bias";
  write_checkpoint(dir, tiny_k31(), "", k_norm_bias);
  VerifyReport missing = verify_dir(dir);
  ASSERT_FALSE(missing.complete());
  EXPECT_TRUE(has_problem(missing, "tensor " + k_norm_bias + " (expected from config.json) is in no shard"))
      << missing.problems[0];

  // A K3 checkpoint relabelled K3.1 (no indexer at all) fails on each of the 10 tensors.
  json k3 = read_json(kDemo / "config.json");
  write_checkpoint(dir, k3);
  { std::ofstream(dir / "config.json") << tiny_k31().dump(2); }
  VerifyReport relabelled = verify_dir(dir);
  size_t indexer_missing = 0;
  for (const auto& p : relabelled.problems)
    if (p.find(".self_attn.indexer.") != std::string::npos) ++indexer_missing;
  EXPECT_EQ(indexer_missing, 10u);
  fs::remove_all(dir);
}

// Runs `moonrun ARGS` with stderr captured; returns {exit status, stderr}.
std::pair<int, std::string> run_moonrun(const std::string& args, const fs::path& dir) {
  const std::string err_file = (dir / "err.txt").string();
  const std::string cmd = "timeout 120 " + std::string(MOONRUN_EXE) + " " + args + " >/dev/null 2>" + err_file;
  const int st = std::system(cmd.c_str());
  std::ifstream e(err_file);
  const std::string err((std::istreambuf_iterator<char>(e)), {});
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, err};
}

// generate loads a K3.1 checkpoint and runs its forward on the CPU (the DSA layers included);
// kimi_k31_forward_test.cpp checks what it computes.
TEST(KimiK31Load, GenerateRunsTheForwardOnTheCpu) {
  const fs::path dir = temp_dir("load");
  write_checkpoint(dir, tiny_k31());
  auto [gst, gerr] = run_moonrun("generate --model " + dir.string() + " --device cpu --token-ids 1,2 --max-tokens 2", dir);
  EXPECT_EQ(gst, 0) << gerr;
  fs::remove_all(dir);
}

// `moonrun plan` for Kimi K3.1-Pro against hand arithmetic. The weights are K3's plus the
// indexers of the 24 DSA layers, all BF16:
//   wq_b         32 x 128 x 1536 = 6,291,456
//   wk           128 x 7168      =   917,504
//   weights_proj 32 x 7168       =   229,376
//   k_norm       128 + 128       =       256
//   = 7,438,592 params x 2 bytes = 14,877,184 bytes a layer, x 24 = 357,052,416 bytes,
// replicated on every rank. K3's config gives 1,560,937,644,285 bytes (docs/deployment.md),
// so K3.1-Pro comes to about 1,560.94 + 0.36 = 1,561.29 GB (+ 120 header entries): the
// card's 1,561.29 GB. 92 % rule: 8 x B300 (2,100 GB) 1,932 - 1,561.29 = 370.7 GB left ("about
// 371"); 8 x H200 (1,128 GB) 1,037.76 < 1,561.29: does not fit.
// Cache per token (bf16 latent): 24 MLA layers x (512 + 64) x 2 = 27,648 bytes of latent rows
// + 24 DSA layers x (128 FP8 + one 4-byte fp32 scale) = 3,168 bytes of indexer keys
// = 30,816 bytes; with an fp8 latent 24 x 576 + 3,168 = 16,992.
TEST(KimiK31Plan, ProIsK3PlusTheIndexersAndItsKeys) {
  auto k31 = tools::load_plan_model("kimi-k3.1-pro");
  ASSERT_TRUE(k31.is_ok()) << k31.status().message();
  auto k3 = tools::load_plan_model("kimi-k3");
  ASSERT_TRUE(k3.is_ok()) << k3.status().message();
  constexpr uint64_t kIndexers = 357'052'416ull;
  uint64_t indexer_group = 0;
  for (const auto& g : k31->weights.groups)
    if (g.name == "DSA indexer") {
      EXPECT_EQ(g.shard, tools::Shard::kReplicated);
      EXPECT_EQ(g.n_tensors, 24u * 5);
      indexer_group += g.bytes;
    }
  EXPECT_EQ(indexer_group, kIndexers);
  auto text = [](const tools::WeightBytes& w) {
    uint64_t t = 0;
    for (const auto& g : w.groups)
      if (g.name != "vision tower + projector") t += g.bytes;
    return t;
  };
  EXPECT_EQ(text(k31->weights), text(k3->weights) + kIndexers);
  EXPECT_EQ(k31->weights.bytes_of(tools::Shard::kReplicated), k3->weights.bytes_of(tools::Shard::kReplicated) + kIndexers);
  // The loader's per-rank sum agrees: every rank holds all the indexers.
  const ParallelRank rank{5, 8, 8};
  EXPECT_EQ(rank_weight_bytes(k31->shape.config, rank), rank_weight_bytes(k3->shape.config, rank) + kIndexers);
  EXPECT_NEAR(double(k31->weights.total_bytes()), 1'561.29e9, 0.005e9);

  // The config file gives the same plan as the built-in name.
  auto file = tools::load_plan_model(kPro.string());
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  EXPECT_EQ(file->weights.total_bytes(), k31->weights.total_bytes());

  auto plan = [&](const tools::LoadedModel& m, const char* gpu, int kv_bytes) {
    tools::PlanInputs in;
    in.shape = m.shape;
    in.weights = m.weights;
    in.gpu = *tools::find_gpu(gpu);
    in.kv_dtype_bytes = kv_bytes;
    auto p = tools::make_plan(in);
    EXPECT_TRUE(p.is_ok()) << p.status().message();
    return *p;
  };
  const tools::Plan b300 = plan(*k31, "B300", 2);
  EXPECT_EQ(b300.kv_bytes_per_token, 24u * 576 * 2 + 24u * (128 + 4));
  EXPECT_EQ(b300.kv_bytes_per_token, 30'816u);
  EXPECT_EQ(plan(*k3, "B300", 2).kv_bytes_per_token, 27'648u);
  EXPECT_EQ(plan(*k31, "B300", 1).kv_bytes_per_token, 16'992u);
  EXPECT_TRUE(b300.fits);
  EXPECT_NEAR(double(b300.vm_rule_left_bytes), 371e9, 1e9);
  const tools::Plan h200 = plan(*k31, "H200", 2);
  EXPECT_FALSE(h200.fits);
  EXPECT_LT(h200.vm_rule_left_bytes, 0);
  const std::string table = tools::format_plan_table(b300);
  EXPECT_NE(table.find("+ 24 x 132 B indexer keys"), std::string::npos) << table;
}

}  // namespace
}  // namespace moonrun
