// The prefill lane (runtime/prefill_lane.h, issue #47) on the CPU backend with the reference
// fixtures: a long prompt's chunks after its first run on a second runner, on a thread of its
// own, while the engine's steps go on with the other requests. Nothing may change but when
// things run:
//   - greedy tokens equal a run without the lane, for long prompts beside short ones, in a
//     pool with room and in one small enough that requests are preempted around the one on
//     the lane;
//   - a prompt prefilled on the lane is cached like any other (a later request with the same
//     prefix restores its KDA snapshot and shares its pages) and gives the same tokens;
//   - an abort of the request on the lane waits for its chunk, then frees it; the others
//     finish as without it;
//   - a long prompt that arrives while the lane is free runs there whole, its first chunk
//     too: no shared step carries any of it;
//   - a tensor-parallel group's lane (every rank's lane runner, their collectives in a group
//     of their own) gives the tokens of the group without it, and of one rank;
//   - beside a DSpark draft the lane's chunks give the draft the context rows a shared step
//     would: the same tokens, and the drafts accepted as often.
// The two lanes really run at once here (two threads over one set of weights and pools), so a
// race on shared memory shows as a token that differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../../support/fixture_files.h"
#include "../../support/runtimes.h"
#include "engine/engine.h"
#include "runtime/model_runner.h"

namespace moonrun {
namespace {

using testing::make_runtime;
using testing::test_runtime_options;

struct Case {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
};

// Long prompts (several chunks of 64, up to 700 tokens) between short ones.
std::vector<Case> mixed_cases(int vocab, uint64_t seed) {
  uint64_t x = seed;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  };
  std::vector<Case> cases;
  const int lengths[] = {420, 9, 700, 30, 15, 333, 64, 5};
  for (int i = 0; i < 8; ++i) {
    Case c;
    for (int t = 0; t < lengths[i]; ++t) c.prompt.push_back(next());
    c.max_tokens = 12 + (i * 5) % 17;
    cases.push_back(c);
  }
  return cases;
}

struct LaneRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int> cached;  // each request's prompt tokens served from the prefix cache
  EngineStats stats;
  int64_t lane_steps = 0;
  int64_t lane_tokens = 0, main_tokens = 0;  // new tokens through each runner
  std::vector<float> draft_rows;  // a DSpark draft's context rows (its pool), at the end
  int aborted = -1;  // the request the abort met on the lane
};

struct RunOptions {
  int lane_min_tokens = 0;  // 0: no lane
  int64_t pool_tokens = 4096;
  bool prefix_cache = false;
  // The first request seen on the lane is aborted there. (Which one is up to the threads'
  // timing: the lane takes a long prompt when it is free, and the first long one may still
  // hold it when the next arrives; a fixed request id was not always on it.)
  bool abort_on_lane = false;
  double lane_step_ms = 0;  // EngineConfig::prefill_lane_step_ms
  int tp = 1, ep = 1;       // a tensor-parallel group (CPU ranks as threads)
  std::string draft;        // a DSpark draft, speculating k tokens
  int k = 0;
};

// waves: a wave's requests are submitted once the wave before has finished.
LaneRun run_engine(const std::string& dir, const std::vector<std::vector<Case>>& waves, const RunOptions& o) {
  LaneRun run;
  RuntimeOptions ro = test_runtime_options("cpu", o.pool_tokens, 4);
  ro.prefix_cache = o.prefix_cache;
  ro.prefix_block_tokens = 64;
  ro.prefix_snapshot_slots = 32;
  ro.max_tokens_per_step = 64;
  ro.prefill_lane_tokens = o.lane_min_tokens > 0 ? 64 : 0;
  ro.tp_size = o.tp;
  ro.ep_size = o.ep;
  SpeculativeConfig spec;
  if (!o.draft.empty()) {
    spec.method = SpecMethod::kDSpark;
    spec.num_speculative_tokens = o.k;
    spec.draft_model = o.draft;
    ro.num_speculative_tokens = o.k;
    ro.draft_model = o.draft;
  }
  Runtime rt = make_runtime(dir, ro);
  if (!rt.runner) return run;
  if (o.lane_min_tokens > 0) EXPECT_NE(rt.runner->prefill_lane(), nullptr) << dir;
  CacheManager cache(rt.cache);
  EngineConfig ec;
  ec.scheduler = {.max_running_requests = 4, .max_tokens_per_step = 64};
  ec.max_model_len = static_cast<int>(std::min<int64_t>(1024, o.pool_tokens));
  ec.prefill_lane_min_tokens = o.lane_min_tokens;
  ec.prefill_lane_chunk_tokens = 64;
  ec.prefill_lane_step_ms = o.lane_step_ms;
  ec.speculative = spec;
  size_t total = 0;
  for (const auto& w : waves) total += w.size();
  run.tokens.resize(total);
  run.cached.assign(total, 0);
  {
    Engine engine(ec, cache, *rt.runner, nullptr);
    std::vector<RequestOutput> outs;
    size_t id = 0;
    for (const auto& wave : waves) {
      for (const Case& c : wave) {
        SamplingParams p;
        p.temperature = 0;
        p.max_tokens = c.max_tokens;
        EXPECT_TRUE(engine.add_request(id++, c.prompt, p).is_ok());
      }
      while (engine.has_work()) {
        const Status st = engine.step(outs);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        if (!st.is_ok()) break;
        if (o.abort_on_lane && run.aborted < 0) {
          for (const Request* r : engine.scheduler().running())
            if (r->in_lane) {
              run.aborted = static_cast<int>(r->group_id);
              engine.abort_request(r->group_id, outs);
              break;
            }
        }
      }
    }
    for (const RequestOutput& out : outs) {
      auto& t = run.tokens[out.request_id];
      t.insert(t.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished) run.cached[out.request_id] = out.num_cached_tokens;
    }
    run.stats = engine.stats();
    EXPECT_EQ(run.stats.cache.free_slots, 4) << dir;
  }
  if (PrefillLane* lane = rt.runner->prefill_lane()) {
    run.lane_steps = lane->runner().stats().steps;
    run.lane_tokens = lane->runner().stats().tokens_computed;
  }
  run.main_tokens = rt.runner->stats().tokens_computed;
  if (const auto* mr = dynamic_cast<const ModelRunner*>(rt.runner.get()); mr && mr->draft()) {
    const Tensor& kv = mr->draft_pool().kv;
    EXPECT_EQ(kv.dtype, DType::F32);
    run.draft_rows.assign(kv.as<float>(), kv.as<float>() + kv.numel());
  }
  return run;
}

const char* const kFixtures[] = {"k3-tiny-a", "k31-tiny-a", "kimi-linear-tiny"};

int vocab_of(const std::string& dir) {
  const auto rt = build_runtime(dir, test_runtime_options("cpu", 1024));
  return rt.is_ok() ? rt.value().config.vocab_size : 0;
}

TEST(PrefillLane, LongPromptsOnTheLaneGiveTheTokensOfOneLane) {
  for (const char* name : kFixtures) {
    const std::string dir = fixtures::fixtures_dir() + "/" + name;
    const std::vector<Case> cases = mixed_cases(vocab_of(dir), 7);
    const LaneRun plain = run_engine(dir, {cases}, {});
    // A pool with room, then one where the requests beside the lane's are preempted (and the
    // shared steps paced while the lane works).
    for (const int64_t pool : {4096, 1100}) {
      const LaneRun lane =
          run_engine(dir, {cases}, {.lane_min_tokens = 200, .pool_tokens = pool, .lane_step_ms = pool == 1100 ? 2.0 : 0});
      for (size_t i = 0; i < cases.size(); ++i)
        EXPECT_EQ(lane.tokens[i], plain.tokens[i]) << name << ", pool " << pool << ", request " << i;
      // 420, 700 and 333 tokens: 6 + 10 + 5 chunks of 64 after their first, at least some on the lane.
      EXPECT_GT(lane.lane_steps, 5) << name;
      if (pool == 1100) EXPECT_GT(lane.stats.preemptions_total, 0) << name;
      std::printf("%s pool %lld: %lld lane chunks, %lld engine steps (without the lane %lld), %lld preemptions\n",
                  name, static_cast<long long>(pool), static_cast<long long>(lane.lane_steps),
                  static_cast<long long>(lane.stats.steps_total), static_cast<long long>(plain.stats.steps_total),
                  static_cast<long long>(lane.stats.preemptions_total));
    }
  }
}

TEST(PrefillLane, APromptPrefilledOnTheLaneIsCachedLikeAnyOther) {
  for (const char* name : kFixtures) {
    const std::string dir = fixtures::fixtures_dir() + "/" + name;
    std::vector<Case> first = mixed_cases(vocab_of(dir), 11);
    // The second wave: the long prompts again, with another tail.
    std::vector<Case> second;
    for (const Case& c : first)
      if (c.prompt.size() >= 200) {
        Case d = c;
        d.prompt.push_back(3);
        d.prompt.push_back(4);
        second.push_back(d);
      }
    const LaneRun plain = run_engine(dir, {first, second}, {.prefix_cache = true});
    const LaneRun lane = run_engine(dir, {first, second}, {.lane_min_tokens = 200, .prefix_cache = true});
    ASSERT_EQ(lane.tokens.size(), plain.tokens.size());
    for (size_t i = 0; i < lane.tokens.size(); ++i) EXPECT_EQ(lane.tokens[i], plain.tokens[i]) << name << ", request " << i;
    for (size_t i = first.size(); i < lane.tokens.size(); ++i) {
      EXPECT_GE(lane.cached[i], 256) << name << ", request " << i << ": its prefix was prefilled on the lane";
      EXPECT_EQ(lane.cached[i], plain.cached[i]) << name << ", request " << i;
    }
    EXPECT_GT(lane.lane_steps, 5) << name;
  }
}

TEST(PrefillLane, ALongPromptArrivingWithTheLaneFreeRunsThereWhole) {
  for (const char* name : kFixtures) {
    const std::string dir = fixtures::fixtures_dir() + "/" + name;
    const std::vector<Case> all = mixed_cases(vocab_of(dir), 13);
    // The 700-token prompt first (the lane is free), a 9-token one beside it.
    const std::vector<Case> cases = {all[2], all[1]};
    const LaneRun plain = run_engine(dir, {cases}, {});
    const LaneRun lane = run_engine(dir, {cases}, {.lane_min_tokens = 200});
    ASSERT_EQ(lane.tokens.size(), 2u);
    EXPECT_EQ(lane.tokens, plain.tokens) << name;
    ASSERT_FALSE(lane.tokens[0].empty());
    EXPECT_EQ(lane.lane_tokens, 700) << name << ": the whole long prompt on the lane";
    // The main steps: the short prompt and every decode, nothing of the long prompt.
    const int64_t decodes = static_cast<int64_t>(lane.tokens[0].size() + lane.tokens[1].size()) - 2;
    EXPECT_EQ(lane.main_tokens, 9 + decodes) << name;
    EXPECT_EQ(plain.main_tokens, 700 + 9 + decodes) << name;
  }
}

TEST(PrefillLane, AGroupsLaneGivesTheTokensOfTheGroupWithoutIt) {
  struct Group {
    const char* fixture;
    int tp, ep;
  };
  for (const Group g : {Group{"k3-tiny-b", 2, 2}, Group{"k3-tiny-b", 4, 4}, Group{"k3-tiny-a", 2, 2}}) {
    SCOPED_TRACE(std::string(g.fixture) + " tp" + std::to_string(g.tp) + " ep" + std::to_string(g.ep));
    const std::string dir = fixtures::fixtures_dir() + "/" + g.fixture;
    const std::vector<Case> cases = mixed_cases(vocab_of(dir), 17);
    const LaneRun one = run_engine(dir, {cases}, {});
    const LaneRun plain = run_engine(dir, {cases}, {.tp = g.tp, .ep = g.ep});
    const LaneRun lane = run_engine(dir, {cases}, {.lane_min_tokens = 200, .tp = g.tp, .ep = g.ep});
    ASSERT_EQ(lane.tokens.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(lane.tokens[i], plain.tokens[i]) << "request " << i;
      EXPECT_EQ(lane.tokens[i], one.tokens[i]) << "request " << i << " (one rank)";
    }
    // 420, 700 and 333 tokens in chunks of 64, one prompt on the lane at a time.
    EXPECT_GT(lane.lane_steps, 5);
    EXPECT_GT(lane.lane_tokens, 420);
  }
}

TEST(PrefillLane, BesideADSparkDraftItsChunksFeedTheDraft) {
  const std::string demo = fixtures::source_dir() + "/models/moonrun-demo";
  const std::string draft = fixtures::source_dir() + "/models/moonrun-demo-dspark";
  if (!std::filesystem::exists(draft + "/config.json")) GTEST_SKIP() << "no trained demo draft in " << draft;
  const std::vector<Case> all = mixed_cases(vocab_of(demo), 23);
  const std::vector<Case> cases = {all[0], all[1], all[2], all[3]};  // 420, 9, 700, 30 tokens
  const LaneRun plain = run_engine(demo, {cases}, {.draft = draft, .k = 4});
  const LaneRun lane = run_engine(demo, {cases}, {.lane_min_tokens = 200, .draft = draft, .k = 4});
  ASSERT_EQ(lane.tokens.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(lane.tokens[i], plain.tokens[i]) << "request " << i;
  EXPECT_GT(lane.lane_tokens, 420) << "the long prompts' chunks ran on the lane";
  // Drafts after a prompt prefilled on the lane read the context rows its chunks wrote:
  // without them they would be drafted from stale rows and mostly rejected.
  const auto accepted = [](const LaneRun& r) { return r.stats.spec_accepted_tokens_total; };
  std::printf("accepted drafts: %lld with the lane, %lld without (%lld verifications)\n",
              static_cast<long long>(accepted(lane)), static_cast<long long>(accepted(plain)),
              static_cast<long long>(plain.stats.spec_num_drafts_total));
  EXPECT_GT(plain.stats.spec_num_drafts_total, 0);
  EXPECT_GE(accepted(lane), accepted(plain) * 9 / 10);

  // The draft's context rows themselves: one 700-token prompt, all of it on the lane, writes
  // the rows a run without the lane writes (chunked the same way: within fp32 rounding).
  const LaneRun one_plain = run_engine(demo, {{all[2]}}, {.draft = draft, .k = 4});
  const LaneRun one_lane = run_engine(demo, {{all[2]}}, {.lane_min_tokens = 200, .draft = draft, .k = 4});
  ASSERT_EQ(one_lane.lane_tokens, 700);
  ASSERT_EQ(one_lane.draft_rows.size(), one_plain.draft_rows.size());
  ASSERT_FALSE(one_plain.draft_rows.empty());
  double worst = 0, scale = 0;
  size_t written = 0;
  for (size_t i = 0; i < one_plain.draft_rows.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(one_lane.draft_rows[i] - one_plain.draft_rows[i])));
    scale = std::max(scale, static_cast<double>(std::abs(one_plain.draft_rows[i])));
    written += one_plain.draft_rows[i] != 0.0f;
  }
  EXPECT_GT(written, 700u) << "the prompt's rows were written";
  EXPECT_LE(worst, 1e-4 * std::max(scale, 1.0)) << "the lane's context rows differ (max |d| " << worst << ")";
}

TEST(PrefillLane, AnAbortWaitsForTheLanesChunkAndTheOthersGoOn) {
  const std::string dir = fixtures::fixtures_dir() + "/k3-tiny-a";
  const std::vector<Case> cases = mixed_cases(vocab_of(dir), 5);
  const LaneRun plain = run_engine(dir, {cases}, {});
  const LaneRun lane = run_engine(dir, {cases}, {.lane_min_tokens = 200, .abort_on_lane = true});
  ASSERT_GE(lane.aborted, 0) << "no request was seen on the lane";
  EXPECT_GE(cases[static_cast<size_t>(lane.aborted)].prompt.size(), 200u) << "only long prompts take the lane";
  for (size_t i = 0; i < cases.size(); ++i)
    if (static_cast<int>(i) != lane.aborted) EXPECT_EQ(lane.tokens[i], plain.tokens[i]) << "request " << i;
  EXPECT_LT(lane.tokens[static_cast<size_t>(lane.aborted)].size(), plain.tokens[static_cast<size_t>(lane.aborted)].size());
}

}  // namespace
}  // namespace moonrun
