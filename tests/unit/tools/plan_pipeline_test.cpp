// Issue #41: `moonrun plan --pp-size` and the split LatentMoE / router options, on the full
// K3 config. What the projection (bench/project_parallel.py) rests on: per-GPU bytes by
// stage and group, the collectives a decode step issues and which cross nodes, the hops.
#include <cstdio>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/plan.h"

namespace moonrun::tools {
namespace {

using nlohmann::json;

const Result<LoadedModel>& kimi_k3() {
  static const Result<LoadedModel> m = load_plan_model("kimi-k3");
  return m;
}

Plan plan_for(const std::string& gpu, int nodes, int tp, int pp, bool split_latent = false, bool split_router = false,
              bool split_up = true) {
  const auto& m = kimi_k3();
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  PlanInputs in;
  in.shape = m->shape;
  in.weights = m->weights;
  in.gpu = *find_gpu(gpu);
  in.gpus_per_node = 8;
  in.nodes = nodes;
  in.tp = tp;
  in.pp = pp;
  in.split_latent_moe = split_latent;
  in.split_latent_up = split_latent && split_up;
  in.split_router = split_router;
  auto p = make_plan(in);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return *p;
}

uint64_t group_bytes(const PipelineStage& st, const std::string& name) {
  for (const auto& g : st.groups)
    if (g.name == name) return g.per_gpu_bytes;
  return 0;
}

uint64_t layer_group_bytes(const PipelinePlan& pl, const std::string& name) {
  uint64_t t = 0;
  for (const auto& st : pl.stages) t += group_bytes(st, name);
  return t;
}

// Without PP or a split, the per-tensor sum by stage is the figure plan always printed.
TEST(PlanPipeline, OneStageIsThePlanWeightsPerGpu) {
  Plan p = plan_for("H200", 2, 16, 1);
  ASSERT_EQ(p.pipeline.stages.size(), 1u);
  EXPECT_NEAR(double(p.pipeline.max_stage_per_gpu_bytes), double(p.weights_per_gpu_bytes), 1e6);
  const PipelineStage& st = p.pipeline.stages[0];
  EXPECT_EQ(st.first_layer, 0);
  EXPECT_EQ(st.end_layer, 93);
  EXPECT_EQ(st.n_mla + st.n_kda, 93);
  EXPECT_EQ(st.n_moe, 92);
  EXPECT_EQ(st.kv_bytes_per_token, p.kv_bytes_per_token);
}

// PP 2 halves what a GPU holds of the layers: the two stages' groups add up to one stage's
// at the same TP, and the busiest stage is within one layer of half.
TEST(PlanPipeline, TwoStagesHalveThePerGpuLayerBytes) {
  Plan one = plan_for("H200", 1, 8, 1);
  Plan two = plan_for("H200", 2, 8, 2);
  ASSERT_EQ(two.pipeline.stages.size(), 2u);
  const auto& s0 = two.pipeline.stages[0];
  const auto& s1 = two.pipeline.stages[1];
  EXPECT_EQ(s0.first_layer, 0);
  EXPECT_EQ(s0.end_layer, s1.first_layer);
  EXPECT_EQ(s1.end_layer, 93);
  // The ring (model/pipeline.h): embedding and head on stage 0, which samples.
  EXPECT_TRUE(s0.has_embedding && s0.has_head && !s1.has_head && !s1.has_embedding);
  const double whole = double(one.pipeline.max_stage_per_gpu_bytes);
  EXPECT_NEAR(double(s0.per_gpu_bytes + s1.per_gpu_bytes), whole, 1e6);
  const double one_layer = whole / 93 * 1.5;  // a MoE layer, with slack for the dense first
  EXPECT_LE(double(two.pipeline.max_stage_per_gpu_bytes), whole / 2 + one_layer);
  EXPECT_EQ(two.weights_per_gpu_bytes, two.pipeline.max_stage_per_gpu_bytes);
  // Each group splits by layer: the replicated LatentMoE projections of one GPU halve too.
  const uint64_t latent = layer_group_bytes(one.pipeline, "LatentMoE down/up projections");
  EXPECT_GT(latent, 9'000'000'000u);  // 9.45 GB replicated on every rank today
  EXPECT_EQ(layer_group_bytes(two.pipeline, "LatentMoE down/up projections"), latent);
  EXPECT_NEAR(double(group_bytes(s0, "LatentMoE down/up projections")), latent / 2.0, latent / 92.0 * 2);
  // Caches live with their layers: the stages' KV rows and KDA state add up to the model's.
  EXPECT_EQ(s0.kv_bytes_per_token + s1.kv_bytes_per_token, one.pipeline.stages[0].kv_bytes_per_token);
  EXPECT_EQ(s0.n_mla + s1.n_mla, 24);
  EXPECT_EQ(s0.n_kda + s1.n_kda, 69);
}

// Split router bytes = replicated / TP; the LatentMoE projections the same; the savings
// the plan states are the difference.
TEST(PlanPipeline, SplitRouterAndLatentMoeAreReplicatedOverTp) {
  for (int tp : {8, 16}) {
    const int nodes = tp / 8;
    Plan rep = plan_for("H200", nodes, tp, 1);
    Plan split = plan_for("H200", nodes, tp, 1, true, true);
    const auto& r = rep.pipeline.stages[0];
    const auto& s = split.pipeline.stages[0];
    const uint64_t router = group_bytes(r, "MoE router"), latent = group_bytes(r, "LatentMoE down/up projections");
    EXPECT_NEAR(double(router), 1.18e9, 0.01e9);  // fp32 [896, 7168] x 92 layers (+ bias)
    EXPECT_NEAR(double(group_bytes(s, "MoE router")), double(router) / tp, 92.0 * tp);
    EXPECT_NEAR(double(group_bytes(s, "LatentMoE down/up projections")), double(latent) / tp, 92.0 * 2 * tp);
    EXPECT_NEAR(double(rep.pipeline.router_split_saves_per_gpu), double(router) * (1 - 1.0 / tp), 1e3);
    EXPECT_NEAR(double(rep.pipeline.latent_moe_split_saves_per_gpu), double(latent) * (1 - 1.0 / tp), 1e3);
    EXPECT_NEAR(double(r.per_gpu_bytes - s.per_gpu_bytes),
                double(rep.pipeline.router_split_saves_per_gpu + rep.pipeline.latent_moe_split_saves_per_gpu), 1e4);
    // One packed all-gather a MoE layer for the latent row and the logits (fp32), and the
    // routed sum's all-reduce apart from the shared experts' (the split up projection needs
    // it before the norm), as the runtime's forward issues them.
    EXPECT_EQ(split.pipeline.collectives_per_step, rep.pipeline.collectives_per_step + 2 * 92);
    // The down projection alone: half the pair's bytes off, one all-gather a MoE layer more.
    Plan down = plan_for("H200", nodes, tp, 1, true, false, false);
    EXPECT_NEAR(double(group_bytes(down.pipeline.stages[0], "LatentMoE down/up projections")),
                double(latent) / 2 + double(latent) / 2 / tp, 92.0 * 2 * tp);
    EXPECT_EQ(down.pipeline.collectives_per_step, rep.pipeline.collectives_per_step + 92);
    for (const auto& g : down.pipeline.stages[0].groups)
      EXPECT_EQ(g.partly_split, g.name == "LatentMoE down/up projections") << g.name;
  }
  // One option alone: only its group moves.
  Plan router_only = plan_for("H200", 2, 16, 1, false, true);
  Plan rep = plan_for("H200", 2, 16, 1);
  EXPECT_EQ(group_bytes(router_only.pipeline.stages[0], "LatentMoE down/up projections"),
            group_bytes(rep.pipeline.stages[0], "LatentMoE down/up projections"));
}

// The step's collectives: 93 attention + 92 x (the routed sum and the shared experts' partial
// sum, packed in one all-reduce) + 1 dense MLP + embedding + lm_head gather = 188 (280 before
// the packing: tests/model/bench_parallel_test.cpp counts what the forward issues). Flat TP 16 over
// two nodes sends all of them across; TP 8 x PP 2 none, and two hops instead: the stage
// boundary, and the last stage's logit rows back round the ring to stage 0's head.
TEST(PlanPipeline, CollectivesAndHops) {
  Plan flat = plan_for("H200", 2, 16, 1);
  EXPECT_EQ(flat.pipeline.collectives_per_step, 188);
  EXPECT_EQ(flat.pipeline.cross_node_collectives_per_step, 188);
  EXPECT_TRUE(flat.pipeline.hops.empty());

  Plan pp2 = plan_for("H200", 2, 8, 2);
  EXPECT_EQ(pp2.pipeline.collectives_per_step, 188);
  EXPECT_EQ(pp2.pipeline.cross_node_collectives_per_step, 0);
  ASSERT_EQ(pp2.pipeline.hops.size(), 2u);
  const StageHop& hop = pp2.pipeline.hops[0];
  EXPECT_TRUE(hop.cross_node);
  // The attention-residual state: the prefix and ceil(end / 12) block summaries, fp32.
  const int end = pp2.pipeline.stages[0].end_layer;
  EXPECT_EQ(hop.bytes_per_token, uint64_t(1 + (end + 11) / 12) * 7168 * 4);
  const StageHop& back = pp2.pipeline.hops[1];  // one hidden row, fp32
  EXPECT_EQ(back.from_stage, 1);
  EXPECT_TRUE(back.cross_node);
  EXPECT_EQ(back.bytes_per_token, uint64_t(7168) * 4);

  // 32 x H100: TP 8 x PP 4, three hops and the one back, each across nodes.
  Plan pp4 = plan_for("H100", 4, 8, 4);
  EXPECT_EQ(pp4.pipeline.hops.size(), 4u);
  for (const auto& h : pp4.pipeline.hops) EXPECT_TRUE(h.cross_node);
  EXPECT_EQ(pp4.pipeline.cross_node_collectives_per_step, 0);
  EXPECT_EQ(pp4.pipeline.collectives_per_step, 188);
  // Four nodes, two stages of 16: each stage's TP group spans two nodes.
  Plan tp16pp2 = plan_for("H100", 4, 16, 2);
  EXPECT_EQ(tp16pp2.pipeline.cross_node_collectives_per_step, 188);
  EXPECT_TRUE(tp16pp2.pipeline.hops[0].cross_node);

  // TP 1 has no collectives.
  Plan single = plan_for("B300", 1, 1, 8);
  EXPECT_EQ(single.pipeline.collectives_per_step, 0);
  EXPECT_EQ(single.pipeline.hops.size(), 8u);  // 7 boundaries and the ring back
  EXPECT_FALSE(single.pipeline.hops[0].cross_node);
}

TEST(PlanPipeline, TpTimesPpMustBeTheCluster) {
  const auto& m = kimi_k3();
  ASSERT_TRUE(m.is_ok());
  PlanInputs in;
  in.shape = m->shape;
  in.weights = m->weights;
  in.gpu = *find_gpu("H200");
  in.nodes = 2;
  in.tp = 16;
  in.pp = 2;
  auto p = make_plan(in);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("TP x PP spans every GPU"), std::string::npos) << p.status().message();
  in.tp = 0;  // TP = the GPUs of a stage
  auto q = make_plan(in);
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(q->tp, 8);
  in.pp = 200;
  EXPECT_FALSE(make_plan(in).is_ok());
}

// DP attention x EP (--enable-dp-attention) at TP 8 x EP 8 on K3: every rank holds every
// group but the routed experts whole, and 1/8 of the experts; per step two all-reduces a MoE
// layer (the rows' gather, the experts' sum at the LatentMoE width) and the logits gather,
// no attention, dense, shared or embedding all-reduce; a sequence's caches whole on its rank.
Plan dp_plan(int nodes, int tp, int ep) {
  const auto& m = kimi_k3();
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  PlanInputs in;
  in.shape = m->shape;
  in.weights = m->weights;
  in.gpu = *find_gpu("H200");
  in.nodes = nodes;
  in.tp = tp;
  in.ep = ep;
  in.dp_attention = true;
  auto p = make_plan(in);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return *p;
}

TEST(PlanPipeline, DpAttentionHoldsAllButTheExpertsWhole) {
  const auto& m = kimi_k3();
  ASSERT_TRUE(m.is_ok());
  Plan dp = dp_plan(1, 8, 8);
  Plan tp = plan_for("H200", 1, 8, 1);
  const uint64_t experts = m->weights.bytes_of(Shard::kExpertParallel);
  const uint64_t non_expert = m->weights.bytes_of(Shard::kTensorParallel) + m->weights.bytes_of(Shard::kReplicated);
  ASSERT_GT(experts, 0u);
  EXPECT_NEAR(double(dp.weights_per_gpu_bytes), double(non_expert) + double(experts) / 8, 1.0);
  ASSERT_EQ(dp.pipeline.stages.size(), 1u);
  const PipelineStage& st = dp.pipeline.stages[0];
  // By group: the experts are TP 8 x EP 8's share, every other group its whole-model bytes.
  EXPECT_NEAR(double(st.per_gpu_bytes), double(non_expert) + double(experts) / 8, 1e3);
  std::map<std::string, uint64_t> whole;  // a role's bytes over the model (TP and replicated rows)
  std::map<std::string, bool> is_expert;
  for (const auto& g : m->weights.groups) {
    whole[g.name] += g.bytes;
    is_expert[g.name] = g.shard == Shard::kExpertParallel;
  }
  for (const auto& [name, bytes] : whole) {
    const uint64_t got = group_bytes(st, name);
    if (is_expert[name]) {
      EXPECT_NEAR(double(got), double(bytes) / 8, 1e3) << name;
      EXPECT_EQ(got, group_bytes(tp.pipeline.stages[0], name)) << name;  // as under EP
    } else {
      EXPECT_EQ(got, bytes) << name;
    }
  }
  EXPECT_GT(dp.weights_per_gpu_bytes, tp.weights_per_gpu_bytes);
  for (const auto& g : st.groups) EXPECT_EQ(g.whole_by_dp_attention, g.shard == Shard::kTensorParallel) << g.name;

  // Collectives: 92 MoE layers x (gather + experts' sum) + 1 logits gather; nothing else.
  ASSERT_EQ(st.collectives.size(), 3u);
  EXPECT_EQ(dp.pipeline.collectives_per_step, 2 * 92 + 1);
  EXPECT_EQ(dp.pipeline.cross_node_collectives_per_step, 0);
  const auto& cfg = m->shape.config;
  EXPECT_EQ(st.collectives[0].count, 92);
  EXPECT_EQ(st.collectives[0].bytes_per_token, uint64_t(cfg.hidden_size) * 4);
  EXPECT_EQ(st.collectives[1].count, 92);
  EXPECT_EQ(st.collectives[1].bytes_per_token, uint64_t(cfg.routed_expert_hidden_size) * 4);
  EXPECT_LT(cfg.routed_expert_hidden_size, cfg.hidden_size);
  EXPECT_EQ(st.collectives[2].count, 1);
  EXPECT_EQ(st.collectives[2].bytes_per_token, uint64_t(cfg.vocab_size) * 4);
  for (const auto& c : st.collectives) {
    EXPECT_FALSE(c.all_gather) << c.what;  // gathers as sums: all-reduces
    EXPECT_EQ(c.what.find("o_proj"), std::string::npos) << c.what;
    EXPECT_EQ(c.what.find("shared"), std::string::npos) << c.what;
    EXPECT_EQ(c.what.find("embedding"), std::string::npos) << c.what;
  }
  // Caches: the latent row as before; a sequence's KDA state whole (every head) on its rank.
  EXPECT_EQ(dp.kv_bytes_per_token, tp.kv_bytes_per_token);
  EXPECT_EQ(dp.kda_state_per_gpu_bytes_per_seq, dp.kda_state_bytes_per_seq);
  EXPECT_EQ(tp.kda_state_per_gpu_bytes_per_seq * 8, tp.kda_state_bytes_per_seq);
  EXPECT_EQ(st.kda_state_per_gpu_bytes_per_seq, dp.kda_state_bytes_per_seq);

  // Over two nodes (TP 16 x EP 16) every one crosses them.
  Plan two = dp_plan(2, 16, 16);
  EXPECT_EQ(two.pipeline.cross_node_collectives_per_step, 185);
}

TEST(PlanPipeline, DpAttentionRefusesStagesAndSplits) {
  const auto& m = kimi_k3();
  ASSERT_TRUE(m.is_ok());
  PlanInputs in;
  in.shape = m->shape;
  in.weights = m->weights;
  in.gpu = *find_gpu("H200");
  in.nodes = 2;
  in.tp = 8;
  in.pp = 2;
  in.dp_attention = true;
  auto p = make_plan(in);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("--enable-dp-attention with --pp-size > 1"), std::string::npos)
      << p.status().message();
  in.pp = 1, in.tp = 16;
  in.split_router = true;
  auto q = make_plan(in);
  ASSERT_FALSE(q.is_ok());
  EXPECT_NE(q.status().message().find("--split-router / --split-latent-moe"), std::string::npos) << q.status().message();
  in.split_router = false, in.split_latent_moe = true;
  EXPECT_FALSE(make_plan(in).is_ok());
  in.split_latent_moe = false, in.nodes = 1, in.gpus_per_node = 1, in.tp = 1;
  auto r = make_plan(in);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--tp-size >= 2"), std::string::npos) << r.status().message();
}

std::string run(const std::string& args, int* rc) {
  std::string out;
  FILE* p = popen((std::string(MOONRUN_EXE) + " plan " + args + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *rc = WEXITSTATUS(pclose(p));
  return out;
}

TEST(PlanPipelineCli, PpSizeSetsTheNodesAndPrintsStages) {
  int rc = 0;
  std::string out = run("kimi-k3 --gpu H200 --tp-size 8 --pp-size 2 --split-router --json", &rc);
  ASSERT_EQ(rc, 0) << out;
  json j = json::parse(out);
  EXPECT_EQ(j["nodes"].get<int>(), 2);
  EXPECT_EQ(j["pp"].get<int>(), 2);
  EXPECT_EQ(j["pipeline"]["stages"].size(), 2u);
  EXPECT_TRUE(j["pipeline"]["split_router"].get<bool>());
  EXPECT_FALSE(j["pipeline"]["split_latent_moe"].get<bool>());
  EXPECT_EQ(j["pipeline"]["hops"].size(), 2u);

  out = run("kimi-k3 --gpu H200 --tp-size 8 --pp-size 2", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("TP 8 x EP 8 x PP 2"), std::string::npos) << out;
  EXPECT_NE(out.find("stage 1: layers"), std::string::npos) << out;
  EXPECT_NE(out.find("hop stage 0 -> 1"), std::string::npos) << out;
  EXPECT_NE(out.find("hop stage 1 -> 0"), std::string::npos) << out;
  EXPECT_NE(out.find("188 collectives (0 across nodes)"), std::string::npos) << out;
}

TEST(PlanPipelineCli, EnableDpAttention) {
  int rc = 0;
  // K3's attention, dense and vocabulary weights whole (~114 GB) and 1/16 of the experts do
  // not fit an H200's 0.85 share: DOES NOT FIT (1), with the reason.
  std::string out = run("kimi-k3 --gpu H200 --tp-size 16 --ep-size 16 --nnodes 2 --enable-dp-attention", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("DP attention holds"), std::string::npos) << out;
  EXPECT_NE(out.find("per GPU under DP attention 16 x EP 16"), std::string::npos) << out;
  EXPECT_NE(out.find("whole (DP)"), std::string::npos) << out;
  EXPECT_NE(out.find("185 collectives (185 across nodes)"), std::string::npos) << out;
  EXPECT_EQ(out.find("o_proj"), std::string::npos) << out;

  out = run("kimi-k3 --gpu H200 --tp-size 8 --enable-dp-attention --json", &rc);
  ASSERT_EQ(rc, 1) << out;
  json j = json::parse(out);
  EXPECT_TRUE(j["dp_attention"].get<bool>());
  EXPECT_EQ(j["pipeline"]["collectives_per_step"].get<int>(), 185);

  out = run("kimi-k3 --gpu H200 --tp-size 8 --pp-size 2 --enable-dp-attention", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--enable-dp-attention with --pp-size > 1"), std::string::npos) << out;
  out = run("kimi-k3 --gpu H200 --tp-size 8 --split-latent-moe --enable-dp-attention", &rc);
  EXPECT_EQ(rc, 2) << out;

  // Without the flag: no DP key in the JSON.
  out = run("kimi-k3 --gpu H200 --tp-size 8 --json", &rc);
  ASSERT_NE(rc, 2) << out;
  EXPECT_FALSE(json::parse(out).contains("dp_attention"));
}

}  // namespace
}  // namespace moonrun::tools
