// `moonrun make-slice` beyond K3: a Kimi K2 layout (DeepSeek-V3, INT4 experts in
// compressed-tensors pack-quantized) and K3.1 (DSA layers), from the configs of the reference
// fixtures. What checks the slices is what reads real checkpoints: `verify` (every tensor the
// config implies, with its dtype and shape) and the loader (which also holds each INT4
// expert's weight_shape to its layout), then one CPU step.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../support/runtimes.h"
#include "model/config.h"
#include "runtime/generate.h"
#include "tools/make_slice.h"
#include "tools/verify.h"

namespace moonrun {
namespace {

namespace fs = std::filesystem;

std::string fixture_config(const std::string& name) {
  return std::string(MOONRUN_SOURCE_DIR) + "/tests/fixtures/" + name + "/config.json";
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("moonrun_make_slice_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

nlohmann::json text_config_of(const fs::path& dir) {
  std::ifstream in(dir / "config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  return c.contains("text_config") ? c["text_config"] : c;
}

// verify finds every tensor; the CPU runtime loads it and decodes a few tokens.
void expect_loads_and_runs(const fs::path& dir) {
  VerifyOptions vo;
  vo.model = dir.string();
  vo.progress = nullptr;
  auto report = verify_checkpoint(vo);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_TRUE(report->complete()) << format_verify_report(*report);

  Runtime rt = testing::make_runtime(dir.string(), testing::test_runtime_options("cpu", 256));
  ASSERT_TRUE(rt.runner);
  GenerateOptions g;
  g.max_tokens = 4;
  auto out = generate(*rt.runner, rt.cache.page_size_tokens, {1, 2, 3, 4, 5, 6, 7}, g);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out->token_ids.size(), 4u);
}

TEST(MakeSlice, KimiK2LayoutWithInt4Experts) {
  const fs::path dir = fresh_dir("k2");
  tools::SliceConfig c;
  c.config_path = fixture_config("k2-tiny-int4");
  c.layers = {"mla-dense", "mla-moe", "mla-moe"};
  c.out_dir = dir.string();
  c.num_experts = 8;  // of 16, in groups of 4: DeepSeek-V3's key names
  c.threads = 2;
  auto r = tools::make_slice(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const nlohmann::json text = text_config_of(dir);
  EXPECT_EQ(text["n_routed_experts"], 8);
  EXPECT_EQ(text["n_group"], 4);
  EXPECT_EQ(text["num_hidden_layers"], 3);
  EXPECT_EQ(text["first_k_dense_replace"], 1);
  expect_loads_and_runs(dir);
  fs::remove_all(dir);
}

TEST(MakeSlice, KimiK2LayoutRefusesKdaLayers) {
  tools::SliceConfig c;
  c.config_path = fixture_config("k2-tiny-int4");
  c.layers = {"kda-dense", "mla-moe"};
  c.out_dir = fresh_dir("k2_kda").string();
  auto r = tools::make_slice(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("no kda layers"), std::string::npos) << r.status().to_string();
}

TEST(MakeSlice, KimiK31DsaLayersAreTheSlicesFullAttentionLayers) {
  const fs::path dir = fresh_dir("k31");
  tools::SliceConfig c;
  c.config_path = fixture_config("k31-tiny-a");
  c.layers = {"kda-dense", "mla-moe", "kda-moe", "mla-moe"};
  c.out_dir = dir.string();
  c.threads = 2;
  auto r = tools::make_slice(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const nlohmann::json text = text_config_of(dir);
  EXPECT_EQ(text["dsa_config"]["dsa_layers"], nlohmann::json({2, 4}));
  EXPECT_EQ(text["linear_attn_config"]["full_attn_layers"], nlohmann::json({2, 4}));
  expect_loads_and_runs(dir);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moonrun
