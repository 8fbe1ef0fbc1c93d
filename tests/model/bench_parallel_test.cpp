// `moonrun bench-model --tp-size N --ep-size M` on a real fixture, with the CPU backend's
// ranks as threads of this process (the same group code that runs one GPU a rank): the
// decode steps run across the group, rank 0's per-op table shows the all-reduces the
// forward issues, and the collectives bench checks every rank's sums (rank r contributes
// r + 1) before it times them. Issue #19 runs the same on two H200s.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/fixture_files.h"
#include "tools/bench_model.h"

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
