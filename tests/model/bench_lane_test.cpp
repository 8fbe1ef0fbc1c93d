// `moonrun bench-model --lane-chunk N` (issue #47): per batch size, decode steps while a
// prefill-lane chunk runs beside them, against each alone, on the CPU backend's two threads
// (the GPU run gives the figures; here the mechanism): every row ran both ways, decode steps
// really ran while a chunk did, the JSON carries the rows, and a pool without room for the
// lane's prompt skips its rows with a line that says so.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/fixture_files.h"
#include "tools/bench_model.h"

namespace moonrun {
namespace {

tools::ModelBenchConfig lane_bench() {
  tools::ModelBenchConfig c;
  c.model = fixtures::fixtures_dir() + "/k3-tiny-a";
  c.runtime.device = "cpu";
  c.runtime.log = false;
  c.batches = {1, 2};
  c.context_tokens = 96;
  c.warmup_steps = 1;
  c.decode_steps = 2;
  c.profile = false;
  c.lane_chunk_tokens = 128;
  c.lane_chunks = 2;
  return c;
}

TEST(BenchModelLane, DecodeStepsBesideALaneChunkAgainstEachAlone) {
  auto r = tools::run_model_bench(lane_bench());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->lane.size(), 2u);
  for (const tools::LaneFigure& f : r->lane) {
    SCOPED_TRACE("batch " + std::to_string(f.batch));
    EXPECT_EQ(f.chunk_tokens, 128);
    EXPECT_EQ(f.chunk_context, 96);
    EXPECT_GT(f.decode_ms_alone, 0.0);
    EXPECT_GT(f.decode_ms_beside, 0.0);
    EXPECT_GT(f.chunk_ms_alone, 0.0);
    EXPECT_GT(f.chunk_ms_beside, 0.0);
    EXPECT_GE(f.decode_steps_per_chunk, 1.0);
  }
  const nlohmann::json j = tools::model_bench_to_json(*r);
  ASSERT_TRUE(j.contains("beside_lane"));
  EXPECT_EQ(j["beside_lane"].size(), 2u);
  EXPECT_EQ(j["beside_lane"][1]["batch"], 2);
  const std::string table = tools::format_model_bench(*r);
  EXPECT_NE(table.find("decode beside a prefill-lane chunk"), std::string::npos) << table;
}

TEST(BenchModelLane, NoRoomForTheLanesPromptSkipsItsRows) {
  tools::ModelBenchConfig c = lane_bench();
  c.batches = {1};
  c.runtime.page_size_tokens = 16;
  c.runtime.max_total_tokens = 8 * 16;  // batch 1 needs 7 pages; the lane's prompt 14 more
  auto r = tools::run_model_bench(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->lane.empty());
  ASSERT_EQ(r->decode.size(), 1u);  // the plain rows still ran
  bool skipped = false;
  for (const tools::SkippedRow& s : r->skipped)
    if (s.kind == "lane") {
      skipped = true;
      EXPECT_NE(s.message.find("lane prompt"), std::string::npos) << s.message;
    }
  EXPECT_TRUE(skipped);
}

}  // namespace
}  // namespace moonrun
