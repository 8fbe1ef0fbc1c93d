// `moonrun bench-model --tp-size N --ep-size M` on a real fixture, with the CPU backend's
// ranks as threads of this process (the same group code that runs one GPU a rank): the
// decode steps run across the group, rank 0's per-op table shows the all-reduces the
// forward issues, and the collectives bench checks every rank's sums (rank r contributes
// r + 1) before it times them. Issue #19 runs the same on two H200s.
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/fixture_files.h"
#include "tools/bench_model.h"
#include "tools/plan.h"

namespace moonrun {
namespace {

// k3-tiny-b: 4 heads, 8 MXFP4 experts of intermediate 64, so TP 2 can split each expert
// (32-wide MXFP4 parts) and EP 2 can split the experts (tests/model/parallel_test.cpp).
tools::ModelBenchConfig tiny_bench(int tp, int ep) {
  tools::ModelBenchConfig c;
  c.model = fixtures::fixtures_dir() + "/k3-tiny-b";
  c.runtime.device = "cpu";
  c.runtime.log = false;
  c.runtime.tp_size = tp;
  c.runtime.ep_size = ep;
  c.batches = {1, 3};
  c.context_tokens = 8;
  c.warmup_steps = 1;
  c.decode_steps = 2;
  c.profile_steps = 1;
  return c;
}

TEST(BenchParallel, AGroupDecodesAndTimesItsCheckedCollectives) {
  for (const auto& [tp, ep] : {std::pair{2, 1}, std::pair{2, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " ep " + std::to_string(ep));
    auto r = tools::run_model_bench(tiny_bench(tp, ep));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->tp_size, tp);
    EXPECT_EQ(r->ep_size, ep);
    ASSERT_TRUE(r->collectives.has_value());
    const tools::CollectiveBench& cb = *r->collectives;
    EXPECT_EQ(cb.world, tp);
    EXPECT_TRUE(cb.sums_checked);
    EXPECT_EQ(cb.transport, "threads");
    // Per decode batch: the hidden rows and the MoE combine (k3-tiny-b has MoE layers);
    // the CPU backend has no graphs, so eager figures only.
    ASSERT_EQ(cb.figures.size(), 4u);
    for (const tools::CollectiveFigure& f : cb.figures) {
      EXPECT_FALSE(f.captured);
      EXPECT_GT(f.us, 0.0) << f.what;
    }
    ASSERT_EQ(r->decode.size(), 2u);
    for (const tools::DecodeFigure& f : r->decode) {
      EXPECT_GT(f.tok_s, 0.0);
      EXPECT_EQ(f.floor_tok_s, 0.0) << "no one-device floor for a group";
      // Rank 0's profiled step: the all-reduces sit in the forward.
      double all_reduces = 0;
      for (const tools::OpFigure& o : f.ops)
        if (o.op == "all_reduce_sum") all_reduces += o.calls;
      EXPECT_GT(all_reduces, 0.0);
    }
    const nlohmann::json j = tools::model_bench_to_json(*r);
    EXPECT_EQ(j["tp_size"], tp);
    ASSERT_TRUE(j.contains("collectives"));
    EXPECT_EQ(j["collectives"]["figures"].size(), 4u);
    const std::string table = tools::format_model_bench(*r);
    EXPECT_NE(table.find("collectives, " + std::to_string(tp) + " ranks"), std::string::npos) << table;
    EXPECT_EQ(table.find("achieved / floor"), std::string::npos) << table;
  }
}

// What `moonrun plan` (and so bench/project_parallel.py) counts is what the forward issues:
// rank 0's profiled decode step's all-reduces and all-gathers, under each way of splitting
// the LatentMoE projections and the router (issue #41), equal the plan's collectives a step
// for the same fixture and group.
TEST(BenchParallel, ThePlansCollectivesAreTheOnesTheForwardIssues) {
  struct Mode {
    bool down, up, router;
  };
  auto model = tools::load_plan_model(fixtures::fixtures_dir() + "/k3-tiny-b");
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  int64_t unsplit = 0;
  for (const Mode m : {Mode{false, false, false}, Mode{true, false, false}, Mode{true, true, false},
                       Mode{true, true, true}, Mode{false, false, true}, Mode{true, false, true}}) {
    SCOPED_TRACE(std::string("down ") + (m.down ? "split" : "whole") + ", up " + (m.up ? "split" : "whole") +
                 ", router " + (m.router ? "split" : "whole"));
    tools::ModelBenchConfig c = tiny_bench(2, 2);
    c.batches = {1};
    c.runtime.split_latent_moe = m.down;
    c.runtime.split_latent_up = m.up;
    c.runtime.split_router = m.router;
    auto r = tools::run_model_bench(c);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_EQ(r->decode.size(), 1u);
    double issued = 0;
    for (const tools::OpFigure& o : r->decode[0].ops)
      if (o.op == "all_reduce_sum" || o.op == "all_gather_cols") issued += o.calls;

    tools::PlanInputs in;
    in.shape = model->shape;
    in.weights = model->weights;
    in.gpu = *tools::find_gpu("H200");
    in.gpus_per_node = 2;
    in.tp = in.ep = 2;
    in.split_latent_moe = m.down;
    in.split_latent_up = m.up;
    in.split_router = m.router;
    auto plan = tools::make_plan(in);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    EXPECT_EQ(issued, double(plan->pipeline.collectives_per_step));
    if (!m.down && !m.router) unsplit = plan->pipeline.collectives_per_step;
  }
  // Unsplit: each layer's attention all-reduce, one packed all-reduce a MoE layer (the routed
  // sum with the shared experts'), one a dense MLP, the embedding's and the logits' gather.
  int64_t moe = 0, dense = 0;
  for (const LayerSpec& l : model->shape.config.layers) (l.mlp == MlpKind::moe ? moe : dense) += 1;
  ASSERT_GT(moe, 0);
  EXPECT_EQ(unsplit, int64_t(model->shape.config.layers.size()) + moe + dense + 2);
}

// --standin-collective-us (issue #41): rank 0 of a group timed alone on one device runs
// exactly rank 0's ops of the real group (the same op table, call for call, under each
// split), and every collective waits the stand-in's latency (a step of 2 ms waits is at
// least that many times 2 ms).
TEST(BenchParallel, AStandinGroupRunsRankZerosOpsAlone) {
  struct Mode {
    bool down, up, router;
  };
  for (const Mode m : {Mode{false, false, false}, Mode{true, true, true}}) {
    SCOPED_TRACE(std::string("splits ") + (m.down ? "on" : "off"));
    auto op_calls = [&](double standin_us) {
      tools::ModelBenchConfig c = tiny_bench(2, 2);
      c.batches = {3};
      c.runtime.split_latent_moe = m.down;
      c.runtime.split_latent_up = m.up;
      c.runtime.split_router = m.router;
      c.runtime.standin_collective_us = standin_us;
      auto r = tools::run_model_bench(c);
      EXPECT_TRUE(r.is_ok()) << r.status().to_string();
      std::map<std::string, double> calls;
      if (!r.is_ok() || r->decode.empty()) return std::pair{calls, 0.0};
      for (const tools::OpFigure& o : r->decode[0].ops) calls[o.op] += o.calls;
      // A real group times its collectives alone; a stand-in has no peers to time them with.
      EXPECT_EQ(r->collectives.has_value(), standin_us < 0);
      EXPECT_EQ(tools::model_bench_to_json(*r).value("standin_collective_us", -1.0), standin_us < 0 ? -1.0 : standin_us);
      return std::pair{calls, r->decode[0].step_ms};
    };
    const auto [group, group_ms] = op_calls(-1);
    const auto [alone, alone_ms] = op_calls(0);
    ASSERT_FALSE(group.empty());
    EXPECT_EQ(alone, group);
    const double collectives = group.count("all_reduce_sum") ? group.at("all_reduce_sum") : 0;
    const double gathers = group.count("all_gather_cols") ? group.at("all_gather_cols") : 0;
    ASSERT_GT(collectives + gathers, 0);
    const auto [waited, waited_ms] = op_calls(2000);
    EXPECT_GE(waited_ms, (collectives + gathers) * 2.0) << "every collective waits 2 ms";
  }
  // Refused where it has no meaning.
  tools::ModelBenchConfig one = tiny_bench(1, 1);
  one.runtime.standin_collective_us = 10;
  auto r = tools::run_model_bench(one);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("--standin-collective-us"), std::string::npos) << r.status().to_string();
}

TEST(BenchParallel, OneRankHasNoCollectivesTable) {
  auto r = tools::run_model_bench(tiny_bench(1, 1));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_FALSE(r->collectives.has_value());
  EXPECT_FALSE(tools::model_bench_to_json(*r).contains("collectives"));
}

TEST(BenchParallel, AnImpossibleSplitIsRefusedWithTheFlagNames) {
  auto r = tools::run_model_bench(tiny_bench(2, 3));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--ep-size must divide --tp-size"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace moonrun
