// bench-model's floor at long contexts (issue 47): max(bytes / copy bandwidth, FLOPs / bf16
// peak). The FLOP count is checked against the issue's own figure for K3's MLA decode
// (96 query heads a token: "about 181 FLOP per cached byte", on the H200's ridge of 188-214)
// and against the weights' multiply-adds counted from the config by hand.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "tools/bench_model.h"
#include "tools/kimi_k3_config.h"

namespace moonrun::tools {
namespace {

ModelConfig k3() {
  auto c = parse_model_config(nlohmann::json::parse(kimi_k3_config_json()), "kimi-k3");
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return *c;
}

TEST(BenchModelFloor, K3AttentionCostsAbout181FlopsACachedByte) {
  const ModelConfig c = k3();
  ASSERT_EQ(c.num_attention_heads, 96);
  // No weights (dense bytes 0, no experts routed) isolates the attention term: one token at
  // 1M cached tokens against the bf16 latent rows it reads.
  ModelConfig attn_only = c;
  attn_only.num_experts_per_token = 0;
  const int64_t context = 1 << 20;
  const double flops = decode_step_flops(attn_only, StepBytes{}, true, 1, 1, static_cast<int>(context));
  const double cached_bytes = static_cast<double>(context) * c.num_mla_layers * c.mla_cache_row() * 2.0;
  EXPECT_NEAR(flops / cached_bytes, 181.0, 1.0);
  // Below the H200's ridge (measured 188-214 FLOP/byte): bytes still bind, barely.
  EXPECT_LT(flops / cached_bytes, 188.0);
}

TEST(BenchModelFloor, WeightsCountTwoFlopsAMultiplyAddPerToken) {
  const ModelConfig c = k3();
  int moe_layers = 0;
  for (const LayerSpec& l : c.layers) moe_layers += l.mlp == MlpKind::moe ? 1 : 0;
  ASSERT_GT(moe_layers, 0);
  StepBytes b;
  const int batch = 8, tokens_each = 5;
  b.dense = 1e9 * 2.0 + batch * c.hidden_size * 2.0;  // 1e9 bf16 dense parameters, plus the batch's rows
  const double per_token = 2.0 * (1e9 + static_cast<double>(moe_layers) * c.num_experts_per_token * 3.0 *
                                            c.moe_intermediate_size * c.expert_io_dim());
  // Context 0: only the step's own tokens are attended (a verify step's rows see each other).
  const double flops = decode_step_flops(c, b, true, batch, tokens_each, 0);
  const double attention = batch * tokens_each * ((tokens_each - 1) / 2.0) * c.num_mla_layers *
                           c.num_attention_heads * 2.0 * (c.mla_cache_row() + c.kv_lora_rank);
  EXPECT_DOUBLE_EQ(flops, batch * tokens_each * per_token + attention);
}

// K3.1-Pro (issue 38): a DSA layer's decode reads every indexer key but only its 2,048
// selected latent rows, so at 1M tokens of context the cache term is the keys', and the
// attention FLOPs stop growing with the context where the indexer's start.
TEST(BenchModelFloor, K31DecodeReadsTheIndexerKeysAndTheSelectedRowsOnly) {
  auto parsed = parse_model_config(kimi_k31_pro_config(), "kimi-k3.1-pro");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  const ModelConfig& c = *parsed;
  ASSERT_EQ(c.num_dsa_layers, 24);
  ASSERT_EQ(c.num_mla_layers, 24);
  ASSERT_EQ(c.dsa.index_topk, 2048);
  // moonrun's pools: the latent row [512 | 64] in bf16, the indexer key 128 x F32.
  CacheLayout layout;
  layout.kv_bytes_per_token = 24 * (576 * 2 + 128 * 4);
  const int context = 1 << 20, batch = 8;
  const StepBytes b = decode_step_bytes(c, 0, true, layout, batch, context, nullptr);
  EXPECT_DOUBLE_EQ(b.kv_cache, batch * 24.0 * (2048.0 * 1152 + static_cast<double>(context) * 512));
  // Below 2,048 positions every row is selected: the dense layer's bytes.
  const StepBytes short_ctx = decode_step_bytes(c, 0, true, layout, batch, 1000, nullptr);
  EXPECT_DOUBLE_EQ(short_ctx.kv_cache, batch * 1000.0 * layout.kv_bytes_per_token);

  ModelConfig attn_only = c;
  attn_only.num_experts_per_token = 0;
  const double flops = decode_step_flops(attn_only, StepBytes{}, true, 1, 1, context);
  const double attention = 24.0 * 2048 * c.num_attention_heads * 2.0 * (c.mla_cache_row() + c.kv_lora_rank);
  const double indexer = 24.0 * context * 2.0 * 32 * (128 + 1);
  EXPECT_DOUBLE_EQ(flops, attention + indexer);
}

}  // namespace
}  // namespace moonrun::tools
