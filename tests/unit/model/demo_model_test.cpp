// The demo model as the build copies it (build/demo-model, from models/moonrun-demo): a K3
// config whose special ids agree with its tokenizer, the tokenizer's K3 names where K3 puts
// them, and a checkpoint that loads and generates.
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "chat/tokenizer.h"
#include "model/config.h"
#include "model/demo_model.h"
#include "runtime/generate.h"
#include "runtime/runtime_builder.h"

namespace moonrun {
namespace {

const std::string kDemoDir = std::string(MOONRUN_BINARY_DIR) + "/demo-model";

TEST(DemoModel, TokenizerAndConfigAgree) {
  auto cfg = load_model_config(kDemoDir);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto tok = chat::Tokenizer::load(kDemoDir);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(static_cast<int>(tok->vocab_size()), cfg->vocab_size);
  EXPECT_EQ(tok->special_id("[BOS]"), static_cast<uint32_t>(cfg->bos_token_id));
  EXPECT_EQ(tok->special_id("<|end_of_msg|>"), static_cast<uint32_t>(cfg->eos_token_id));
  EXPECT_EQ(tok->special_id("[PAD]"), static_cast<uint32_t>(cfg->pad_token_id));
  EXPECT_EQ(tok->special_id("<|media_pad|>"), static_cast<uint32_t>(cfg->media_placeholder_token_id));
  // Same names at the same offsets as the tokenizer's own K3 defaults.
  for (const auto& s : chat::kimi_k3_default_special_tokens(tok->num_base_tokens()))
    EXPECT_EQ(tok->special_id(s.name), s.id) << s.name;
  const std::string text = "Hello, moonrun! 123 tokens\n";
  auto ids = tok->encode(text, false);
  EXPECT_LT(ids.size(), text.size());  // the trained merges do something
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(DemoModel, IsK3ShapedAndGenerates) {
  RuntimeOptions ro;
  ro.device = "cpu";
  ro.max_running_requests = 1;
  ro.max_total_tokens = 64;
  ro.log = false;
  auto rt = build_runtime(kDemoDir, ro);
  ASSERT_TRUE(rt.is_ok()) << rt.status().to_string();
  const ModelConfig& cfg = rt->config;
  EXPECT_EQ(cfg.model_type, "kimi_k3");
  EXPECT_EQ(cfg.expert_quant, ExpertQuant::mxfp4_packed);
  EXPECT_GT(cfg.num_kda_layers, 0);
  EXPECT_GT(cfg.num_mla_layers, 0);
  EXPECT_GT(cfg.num_expert_group, cfg.topk_group);
  EXPECT_GT(cfg.attn_res_block_size, 0);
  GenerateOptions opt;
  opt.max_tokens = 3;
  auto r = generate(*rt->runner, rt->cache.page_size_tokens, {cfg.bos_token_id, 5, 6}, opt);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->token_ids.size(), 3u);
}

// `moonrun make-demo-model` (the random K3-shaped checkpoint tests build variants from):
// written twice, the same bytes.
TEST(DemoModel, RandomWriterIsDeterministic) {
  namespace fs = std::filesystem;
  const std::string base = (fs::temp_directory_path() / ("moonrun_demo_again_" + std::to_string(getpid()))).string();
  ASSERT_TRUE(write_demo_model(base + "-a", 1000).is_ok());
  ASSERT_TRUE(write_demo_model(base + "-b", 1000).is_ok());
  auto slurp = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const char* f : {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                        "model.safetensors.index.json", "tokenizer_config.json"}) {
    EXPECT_FALSE(slurp(base + "-a/" + f).empty()) << f;
    EXPECT_TRUE(slurp(base + "-a/" + f) == slurp(base + "-b/" + f)) << f;
  }
  fs::remove_all(base + "-a");
  fs::remove_all(base + "-b");
}

}  // namespace
}  // namespace moonrun
