// Tensor and expert parallelism on the CPU (ranks as threads, backend/cpu/thread_comm.h)
// against one rank and against the reference: every fixture under every split its shapes
// allow gives the reference's greedy ids exactly, and logits that differ from the one-rank
// run only by the order of fp32 sums (the row-parallel projections' partial sums).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/batch_runs.h"
#include "../support/fixture_files.h"
#include "../support/runtimes.h"
#include "runtime/generate.h"
#include "runtime/parallel_runner.h"

namespace moonrun {
namespace {

using fixtures::fixtures_dir;
using fixtures::read_f32;

struct Split {
  const char* fixture;
  int tp, ep;
  int pp = 1;  // pipeline stages, each a tp x ep group
  bool split = false;  // --split-router and --split-latent-moe
  bool dp = false;     // --enable-dp-attention
  bool down = false;   // --split-latent-moe-down (the router whole)
};
// gtest prints a parameter in the test's listing (and ctest's test names): not its bytes.
void PrintTo(const Split& sp, std::ostream* os) {
  *os << sp.fixture << " tp" << sp.tp << " ep" << sp.ep << " pp" << sp.pp << (sp.split ? " split" : "")
      << (sp.dp ? " dp-attention" : "") << (sp.down ? " split-down" : "");
}

std::string split_name(const ::testing::TestParamInfo<Split>& info) {
  std::string n = std::string(info.param.fixture) + "_tp" + std::to_string(info.param.tp) + "_ep" +
                  std::to_string(info.param.ep) + (info.param.pp > 1 ? "_pp" + std::to_string(info.param.pp) : "") +
                  (info.param.split ? "_split" : "") + (info.param.dp ? "_dp_attention" : "") +
                  (info.param.down ? "_split_down" : "");
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

struct CaseRun {
  std::vector<int32_t> ids;
  std::vector<float> logits;
};

// Every case of a fixture through a runtime of tp ranks in ep expert groups.
std::vector<CaseRun> run_cases(const std::string& dir, const nlohmann::json& expected, int tp, int ep, int pp = 1,
                               bool split = false, bool dp = false, bool down = false) {
  RuntimeOptions ro = testing::test_runtime_options("cpu", 256);
  ro.tp_size = tp;
  ro.ep_size = ep;
  ro.pp_size = pp;
  ro.split_router = split;
  ro.split_latent_moe = split || down;
  ro.split_latent_up = split;
  ro.dp_attention = dp;
  Runtime rt = testing::make_runtime(dir, ro);
  std::vector<CaseRun> out;
  if (!rt.runner) return out;
  for (const auto& c : expected.at("cases")) {
    GenerateOptions opt;
    opt.max_tokens = c.at("max_tokens").get<int>();
    opt.sampling.temperature = 0.0f;
    opt.keep_logits = true;
    auto got = generate(*rt.runner, rt.cache.page_size_tokens, c.at("prompt_ids").get<std::vector<int32_t>>(), opt);
    EXPECT_TRUE(got.is_ok()) << got.status().to_string();
    if (!got.is_ok()) break;
    out.push_back({got->token_ids, got->logits});
  }
  return out;
}

float max_abs(const std::vector<float>& a) {
  float m = 0;
  for (float v : a) m = std::max(m, std::fabs(v));
  return m;
}

// fp32 sums taken in another order (the row-parallel projections' partial sums, then the
// all-reduce) through every layer: up to ~1e-5 of the logits' scale on the K3 fixtures,
// the same size as the one-rank forward's own distance to the PyTorch reference (which
// also differs from it only in summation order).
constexpr float kRelTol = 2e-5f;

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= worst)) worst = d;  // NaN too
  }
  return worst;
}

class ParallelFixture : public ::testing::TestWithParam<Split> {};

TEST_P(ParallelFixture, SameTokensAsOneRankAndTheReference) {
  const Split sp = GetParam();
  const std::string dir = fixtures_dir() + "/" + sp.fixture;
  std::ifstream in(dir + "/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  const float ref_tol = expected.at("tolerance_abs_logit").get<float>();
  const std::vector<CaseRun> one = run_cases(dir, expected, 1, 1);
  const std::vector<CaseRun> par = run_cases(dir, expected, sp.tp, sp.ep, sp.pp, sp.split, sp.dp, sp.down);
  ASSERT_EQ(one.size(), expected.at("cases").size());
  ASSERT_EQ(par.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const auto& c = expected.at("cases")[i];
    EXPECT_EQ(par[i].ids, c.at("greedy_ids").get<std::vector<int32_t>>());
    EXPECT_EQ(par[i].ids, one[i].ids);
    ASSERT_EQ(par[i].logits.size(), one[i].logits.size());
    const float vs_one = max_abs_diff(par[i].logits, one[i].logits);
    const auto shape = c.at("logits_shape").get<std::vector<int64_t>>();
    const auto ref = read_f32(dir + "/" + c.at("logits_file").get<std::string>(), static_cast<size_t>(shape[0] * shape[1]));
    const float vs_ref = max_abs_diff(par[i].logits, ref);
    const float scale = max_abs(one[i].logits);
    std::printf("%s tp%d ep%d pp%d case %zu: max |dlogit| vs one rank %.3g (max |logit| %.3g), vs reference %.3g\n",
                sp.fixture, sp.tp, sp.ep, sp.pp, i, vs_one, scale, vs_ref);
    EXPECT_LE(vs_one, kRelTol * scale);
    EXPECT_LE(vs_ref, ref_tol);
  }
}

// The splits each fixture's shapes allow: k3-tiny-a (2 heads, 16 MXFP4 experts of
// intermediate 32), k3-tiny-b (4 heads, 8 MXFP4 experts of 64), kimi-linear-tiny (2 heads,
// 8 bf16 experts of 32), k2-tiny (8 heads, 16 bf16 experts of 32, YaRN RoPE), k2-tiny-int4
// (k2-tiny with INT4 experts: whole experts per rank, so EP = TP), k31-tiny-a/b (K3.1: the
// k3-tiny shapes with DSA layers; the indexer is replicated, so every rank selects the same
// keys for its heads). TP alone splits each expert (an MXFP4 split needs 32-wide parts).
INSTANTIATE_TEST_SUITE_P(Splits, ParallelFixture,
                         ::testing::Values(Split{"k3-tiny-a", 2, 2}, Split{"k3-tiny-b", 2, 1}, Split{"k3-tiny-b", 2, 2},
                                           Split{"k3-tiny-b", 4, 2}, Split{"k3-tiny-b", 4, 4},
                                           Split{"kimi-linear-tiny", 2, 1}, Split{"kimi-linear-tiny", 2, 2},
                                           Split{"k2-tiny", 2, 1}, Split{"k2-tiny", 2, 2}, Split{"k2-tiny", 4, 2},
                                           Split{"k2-tiny", 4, 4}, Split{"k2-tiny-int4", 2, 2},
                                           Split{"k2-tiny-int4", 4, 4}, Split{"k31-tiny-a", 2, 2},
                                           Split{"k31-tiny-b", 2, 1}, Split{"k31-tiny-b", 4, 4}),
                         split_name);

// Pipeline stages (issue 41): contiguous layers per stage, each stage a TP x EP group of its
// own, the residual stream (and under AttnRes the completed block summaries) handed to the
// next stage. k3-tiny-b's 8 layers in AttnRes blocks of 3 cut mid-block at 2 stages and
// again at 4; k3-tiny-a and k31-tiny-a at 3 stages (the DSA layers' indexer keys on their
// stage); K2 and Kimi Linear with plain residuals. A stage alone computes nothing the
// one-rank forward does not, so the logits must equal one rank's to fp32 summation order.
INSTANTIATE_TEST_SUITE_P(Pipeline, ParallelFixture,
                         ::testing::Values(Split{"k3-tiny-b", 1, 1, 2}, Split{"k3-tiny-b", 2, 2, 2},
                                           Split{"k3-tiny-b", 2, 1, 2}, Split{"k3-tiny-b", 1, 1, 4},
                                           Split{"k3-tiny-a", 1, 1, 3}, Split{"k3-tiny-a", 2, 2, 2},
                                           Split{"kimi-linear-tiny", 2, 1, 2}, Split{"k2-tiny", 2, 2, 2},
                                           Split{"k2-tiny-int4", 1, 1, 2}, Split{"k31-tiny-a", 1, 1, 3},
                                           Split{"k31-tiny-b", 2, 2, 2}),
                         split_name);

// Prefill chunks and decodes mixed in steps of up to 7 sequences, at TP 2 / EP 2, and through
// 2 pipeline stages of TP 2 / EP 2 (each stage's KDA slots and MLA pages hold its own layers
// only): the same greedy tokens as one rank, logits within fp32 rounding.
TEST(Parallel, MixedBatchesMatchOneRank) {
  const std::string dir = fixtures_dir() + "/k3-tiny-b";
  RuntimeOptions ro = testing::test_runtime_options("cpu", 256);
  const int vocab = 1024, n = 12, max_tokens = 6;
  const auto one = testing::run_batched(dir, n, max_tokens, 7, vocab, ro);
  for (const int pp : {1, 2}) {
    ro.tp_size = 2;
    ro.ep_size = 2;
    ro.pp_size = pp;
    const auto par = testing::run_batched(dir, n, max_tokens, 7, vocab, ro);
    ASSERT_EQ(one.size(), par.size());
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(one[i].tokens, par[i].tokens) << "pp " << pp << ", sequence " << i;
      EXPECT_LE(max_abs_diff(one[i].logits, par[i].logits), kRelTol * max_abs(one[i].logits))
          << "pp " << pp << ", sequence " << i;
    }
  }
}

// Pipeline micro-batches (issue 41, item 1): a step of several sequences runs as up to one
// micro-batch a stage (ModelRunner::forward_micro_batches: each stage's forward once a
// micro-batch, the rows round the ring once at the end), so an earlier stage goes on with the
// next micro-batch while a later one works. The same mixed prefill/decode steps as above at
// PP 2 x TP 2 x EP 2 and PP 3 (k2-tiny and k3-tiny-b: 3 stages of their layers), micro-batches
// on (one a stage) and off: the greedy tokens of one rank, logits within fp32 rounding, and
// the runner really split its steps.
TEST(Parallel, PipelineMicroBatchesMatchOneRank) {
  struct Case {
    const char* fixture;
    int tp, ep, pp;
  };
  for (const Case c : {Case{"k3-tiny-b", 2, 2, 2}, Case{"k3-tiny-b", 1, 1, 3}, Case{"k2-tiny", 1, 1, 3}}) {
    SCOPED_TRACE(std::string(c.fixture) + " pp" + std::to_string(c.pp) + " tp" + std::to_string(c.tp));
    const std::string dir = fixtures_dir() + "/" + c.fixture;
    RuntimeOptions ro = testing::test_runtime_options("cpu", 256);
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
    const int vocab = config.contains("text_config") ? config["text_config"].value("vocab_size", 0)
                                                     : config.value("vocab_size", 0);
    ASSERT_GT(vocab, 0);
    const int n = 10, max_tokens = 5;
    const auto one = testing::run_batched(dir, n, max_tokens, 7, vocab, ro);
    ro.tp_size = c.tp;
    ro.ep_size = c.ep;
    ro.pp_size = c.pp;
    for (const int micro : {0, 1}) {
      ro.pp_micro_batches = micro;
      int64_t micro_batches = -1;
      const auto par = testing::run_batched(dir, n, max_tokens, 7, vocab, ro, nullptr, &micro_batches);
      ASSERT_EQ(one.size(), par.size());
      if (micro == 0) EXPECT_GT(micro_batches, 0) << "no step was split";
      else EXPECT_EQ(micro_batches, 0);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(one[i].tokens, par[i].tokens) << "micro " << micro << ", sequence " << i;
        EXPECT_LE(max_abs_diff(one[i].logits, par[i].logits), kRelTol * max_abs(one[i].logits))
            << "micro " << micro << ", sequence " << i;
      }
    }
  }
}

// The router split by expert and the LatentMoE projections split over the TP ranks (issue
// 41, item 2): the logits and the latent rows gathered, the up projection's partial sums
// reduced with the shared experts'. K2 has no LatentMoE: its router alone splits. The
// down projection alone split (--split-latent-moe-down): its rows gathered, the routed sum
// reduced packed with the shared experts' partial sum (as every unsplit TP case above).
INSTANTIATE_TEST_SUITE_P(SplitReplicated, ParallelFixture,
                         ::testing::Values(Split{"k3-tiny-b", 2, 2, 1, true}, Split{"k3-tiny-b", 2, 1, 1, true},
                                           Split{"k3-tiny-b", 4, 4, 1, true}, Split{"k3-tiny-b", 2, 2, 2, true},
                                           Split{"k3-tiny-a", 2, 2, 1, true}, Split{"k2-tiny", 2, 2, 1, true},
                                           Split{"k31-tiny-b", 2, 2, 1, true},
                                           Split{"k3-tiny-b", 2, 2, 1, false, false, true},
                                           Split{"k3-tiny-b", 4, 4, 1, false, false, true},
                                           Split{"k3-tiny-b", 2, 2, 2, false, false, true},
                                           Split{"k31-tiny-b", 2, 1, 1, false, false, true}),
                         split_name);

// DP attention x EP (issue 41, item 3; SGLang --enable-dp-attention): attention, the dense
// layers and the vocabulary whole on every rank, run for the rank's own sequences; the routed
// experts split (EP groups, or each expert's intermediate over the ranks at EP 1), every MoE
// layer gathering all ranks' rows. One sequence at a time: rank 0 owns it and the others take
// part in the MoE layers with no rows of their own.
INSTANTIATE_TEST_SUITE_P(DpAttention, ParallelFixture,
                         ::testing::Values(Split{"k3-tiny-a", 2, 2, 1, false, true},
                                           Split{"k3-tiny-b", 2, 2, 1, false, true},
                                           Split{"k3-tiny-b", 2, 1, 1, false, true},
                                           Split{"k3-tiny-b", 4, 4, 1, false, true},
                                           Split{"kimi-linear-tiny", 2, 2, 1, false, true},
                                           Split{"k2-tiny", 2, 2, 1, false, true},
                                           Split{"k2-tiny-int4", 2, 2, 1, false, true},
                                           Split{"k31-tiny-a", 2, 2, 1, false, true}),
                         split_name);

// DP attention with several sequences a step: prefill chunks and decodes of up to 7
// sequences spread over the ranks by state slot, each rank's attention over its own, every
// MoE layer over all of them; at DP 2 x EP 2 and DP 4 x EP 4 on k3-tiny-b (KDA and MLA
// layers, AttnRes) and DP 2 x EP 2 on k2-tiny (MLA, YaRN, a dense first layer).
TEST(Parallel, DpAttentionMixedBatchesMatchOneRank) {
  for (const auto& [fixture, vocab] : {std::pair{"k3-tiny-b", 1024}, std::pair{"k2-tiny", 512}}) {
    const std::string dir = fixtures_dir() + "/" + fixture;
    RuntimeOptions ro = testing::test_runtime_options("cpu", 256);
    const int n = 12, max_tokens = 6;
    const auto one = testing::run_batched(dir, n, max_tokens, 7, vocab, ro);
    for (const int dp : {2, 4}) {
      if (dp == 4 && std::string(fixture) == "k2-tiny") continue;
      ro.tp_size = ro.ep_size = dp;
      ro.dp_attention = true;
      const auto par = testing::run_batched(dir, n, max_tokens, 7, vocab, ro);
      ASSERT_EQ(one.size(), par.size());
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(one[i].tokens, par[i].tokens) << fixture << " dp " << dp << ", sequence " << i;
        EXPECT_LE(max_abs_diff(one[i].logits, par[i].logits), kRelTol * max_abs(one[i].logits))
            << fixture << " dp " << dp << ", sequence " << i;
      }
    }
  }
}

// DP attention holds everything but the routed experts whole: per rank, the one-rank bytes
// less the experts of the other groups.
TEST(Parallel, DpAttentionHoldsAllButTheExpertsWhole) {
  RuntimeOptions ro = testing::test_runtime_options("cpu", 256, 5);
  Runtime one = testing::make_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ro.tp_size = ro.ep_size = 2;
  ro.dp_attention = true;
  Runtime dp = testing::make_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ASSERT_TRUE(one.runner && dp.runner);
  const ModelConfig& c = one.config;
  int moe_layers = 0;
  for (const LayerSpec& l : c.layers) moe_layers += l.mlp == MlpKind::moe;
  // Half of every MoE layer's routed experts: three MXFP4 matrices of [inter, io] each.
  const double half_experts = 0.5 * moe_layers * c.num_experts * 3.0 * c.moe_intermediate_size *
                              c.expert_io_dim() * (0.5 + 1.0 / 32);
  EXPECT_NEAR(double(one.weight_bytes - dp.weight_bytes), half_experts, 0.05 * half_experts);
  // The KV pages: each rank holds its own group of them (CacheConfig::page_groups), so the
  // scheduler has twice one rank's.
  EXPECT_EQ(one.cache.page_groups, 1);
  EXPECT_EQ(dp.cache.page_groups, 2);
  EXPECT_EQ(dp.cache.num_pages % 2, 0);
  // And the state slots (KDA states and conv windows, tens of MB a sequence at K3 width):
  // each rank its own sequences' (slot mod 2), plus the padding slot.
  auto* group = dynamic_cast<ParallelRunner*>(dp.runner.get());
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(dp.cache.num_state_slots, 5);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(group->rank(r).pools().num_slots, 3 + 1) << "rank " << r;
  EXPECT_EQ(dynamic_cast<ModelRunner*>(one.runner.get())->pools().num_slots, one.cache.num_state_slots + 1);
}

// What cannot go with DP attention is refused before anything loads.
TEST(Parallel, DpAttentionThatCannotBeIsAClearError) {
  RuntimeOptions ro = testing::test_runtime_options("cpu", 256);
  ro.dp_attention = true;
  auto rt = build_runtime(fixtures_dir() + "/k3-tiny-b", ro);  // one rank: nothing to share
  ASSERT_FALSE(rt.is_ok());
  EXPECT_NE(rt.status().message().find("--tp-size >= 2"), std::string::npos) << rt.status().message();
  ro.tp_size = ro.ep_size = 2;
  ro.pp_size = 2;
  rt = build_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ASSERT_FALSE(rt.is_ok());
  EXPECT_NE(rt.status().message().find("--pp-size"), std::string::npos) << rt.status().message();
  ro.pp_size = 1;
  ro.split_latent_moe = true;
  rt = build_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ASSERT_FALSE(rt.is_ok());
  EXPECT_NE(rt.status().message().find("--split-latent-moe"), std::string::npos) << rt.status().message();
  ro.split_latent_moe = false;
  ro.num_speculative_tokens = 2;
  rt = build_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ASSERT_FALSE(rt.is_ok());
  EXPECT_NE(rt.status().message().find("speculative"), std::string::npos) << rt.status().message();
}

// What the split takes off one rank: half the router and half of both LatentMoE
// projections of every MoE layer at TP 2 (the CPU holds them in F32).
TEST(Parallel, SplitReplicatedHalvesTheirBytesPerRank) {
  RuntimeOptions ro = testing::test_runtime_options("cpu", 256);
  ro.tp_size = 2;
  ro.ep_size = 2;
  Runtime whole = testing::make_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ro.split_router = ro.split_latent_moe = ro.split_latent_up = true;
  Runtime split = testing::make_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ASSERT_TRUE(whole.runner && split.runner);
  const ModelConfig& c = whole.config;
  int moe_layers = 0;
  for (const LayerSpec& l : c.layers) moe_layers += l.mlp == MlpKind::moe;
  ASSERT_GT(moe_layers, 0);
  const int64_t router = int64_t{c.num_experts} * c.hidden_size * 4;
  const int64_t latent = 2 * int64_t{c.routed_expert_hidden_size} * c.hidden_size * 4;
  const int64_t saved = moe_layers * (router + latent) / 2;
  EXPECT_NEAR(double(whole.weight_bytes - split.weight_bytes), double(saved), 0.02 * double(saved));
  // The down projection alone (--split-latent-moe-down): half of it, a quarter of the pair.
  ro.split_router = ro.split_latent_up = false;
  Runtime down = testing::make_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ASSERT_TRUE(down.runner);
  const int64_t saved_down = moe_layers * latent / 4;
  EXPECT_NEAR(double(whole.weight_bytes - down.weight_bytes), double(saved_down), 0.02 * double(saved_down));
  // The up projection never splits without the down one.
  ro.split_latent_moe = false;
  ro.split_latent_up = true;
  auto up_only = build_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ASSERT_FALSE(up_only.is_ok());
  EXPECT_NE(up_only.status().message().find("--split-latent-moe"), std::string::npos) << up_only.status().message();
}

// More stages than layers, and GPU-less stages across processes without a way to meet, are
// clear errors.
TEST(Parallel, PipelineStagesThatCannotBeAreClearErrors) {
  RuntimeOptions ro = testing::test_runtime_options("cpu", 256);
  ro.pp_size = 7;  // k3-tiny-a has 6 layers
  auto rt = build_runtime(fixtures_dir() + "/k3-tiny-a", ro);
  ASSERT_FALSE(rt.is_ok());
  EXPECT_NE(rt.status().message().find("6 layers"), std::string::npos) << rt.status().message();
  ro.pp_size = 2;
  ro.local_ranks = 1;
  rt = build_runtime(fixtures_dir() + "/k3-tiny-a", ro);
  ASSERT_FALSE(rt.is_ok());
  EXPECT_NE(rt.status().message().find("serve --nnodes"), std::string::npos) << rt.status().message();
}

// What cannot be split is refused before anything loads, naming the dimension.
TEST(Parallel, SplitsThatDoNotDivideAreClearErrors) {
  RuntimeOptions ro = testing::test_runtime_options("cpu", 256);
  ro.tp_size = 4;
  auto rt = build_runtime(fixtures_dir() + "/k3-tiny-a", ro);
  ASSERT_FALSE(rt.is_ok());
  EXPECT_NE(rt.status().message().find("2 attention heads"), std::string::npos) << rt.status().message();
  ro.tp_size = 4;
  ro.ep_size = 1;  // each of k3-tiny-b's experts (intermediate 64) into 4 MXFP4 parts of 16
  rt = build_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ASSERT_FALSE(rt.is_ok());
  EXPECT_NE(rt.status().message().find("32"), std::string::npos) << rt.status().message();
  ro.tp_size = 2;
  ro.ep_size = 3;
  rt = build_runtime(fixtures_dir() + "/k3-tiny-b", ro);
  ASSERT_FALSE(rt.is_ok());
  EXPECT_NE(rt.status().message().find("--ep-size"), std::string::npos) << rt.status().message();
}

}  // namespace
}  // namespace moonrun
