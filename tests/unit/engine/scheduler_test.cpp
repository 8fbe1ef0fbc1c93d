#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>

#include "test_pool.h"

namespace moonrun {
namespace {

using testing::test_pool;

struct Fixture {
  CacheManager cache;
  Scheduler sched;
  std::vector<std::unique_ptr<Request>> reqs;
  Fixture(CacheConfig c, SchedulerConfig s) : cache(c), sched(s, cache) {}

  Request* add(int prompt_len) {
    auto r = std::make_unique<Request>();
    r->seq_id = static_cast<int64_t>(reqs.size());
    r->prompt_ids.assign(prompt_len, 1);
    reqs.push_back(std::move(r));
    EXPECT_TRUE(sched.add(reqs.back().get()).is_ok());
    return reqs.back().get();
  }
  // One step as the engine does it: schedule, "compute", append a token where sampled.
  SchedulerOutput step() {
    SchedulerOutput out = sched.schedule();
    sched.on_step_done(out);
    for (const auto& s : out.seqs)
      if (s.samples) s.req->output_ids.push_back(7);
    return out;
  }
};

std::vector<std::pair<int64_t, int>> plan(const SchedulerOutput& out) {
  std::vector<std::pair<int64_t, int>> p;
  for (const auto& s : out.seqs) p.push_back({s.req->seq_id, s.n_new_tokens});
  return p;
}
using Plan = std::vector<std::pair<int64_t, int>>;

TEST(Scheduler, TokenBudgetChunksLongPromptsAndNewcomersJoinRunningDecodes) {
  Fixture f(test_pool(100, 8, 16), {.max_running_requests = 8, .max_tokens_per_step = 64});
  Request* a = f.add(100);
  Request* b = f.add(50);
  Request* c = f.add(30);
  // Step 1: the budget goes to A's first chunk.
  SchedulerOutput s1 = f.step();
  EXPECT_EQ(plan(s1), (Plan{{0, 64}}));
  EXPECT_FALSE(s1.seqs[0].samples);
  EXPECT_EQ(a->num_computed_tokens, 64);
  // Step 2: A finishes its prompt (36) and samples; B starts with the 28 left.
  SchedulerOutput s2 = f.step();
  EXPECT_EQ(plan(s2), (Plan{{0, 36}, {1, 28}}));
  EXPECT_TRUE(s2.seqs[0].samples);
  EXPECT_FALSE(s2.seqs[1].samples);
  EXPECT_EQ(a->num_output_tokens(), 1);
  // Step 3: A decodes 1 token, B its last 22, C joins with its whole prompt (30 <= 41).
  SchedulerOutput s3 = f.step();
  EXPECT_EQ(plan(s3), (Plan{{0, 1}, {1, 22}, {2, 30}}));
  EXPECT_EQ(s3.n_tokens, 53);
  // Step 4: three decodes in one batch.
  EXPECT_EQ(plan(f.step()), (Plan{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(c->num_output_tokens(), 2);
  EXPECT_EQ(b->num_computed_tokens, 51);
}

TEST(Scheduler, MaxRunningRequestsCapsTheBatch) {
  Fixture f(test_pool(100, 8, 16), {.max_running_requests = 2, .max_tokens_per_step = 1000});
  for (int i = 0; i < 4; ++i) f.add(5);
  EXPECT_EQ(plan(f.step()), (Plan{{0, 5}, {1, 5}}));
  EXPECT_EQ(f.sched.num_waiting(), 2);
  EXPECT_EQ(plan(f.step()), (Plan{{0, 1}, {1, 1}}));
  f.sched.remove(f.reqs[0].get());  // finished: a place opens
  EXPECT_EQ(plan(f.step()), (Plan{{1, 1}, {2, 5}}));
}

TEST(Scheduler, FcfsAHeadThatDoesNotFitBlocksSmallerOnesBehindIt) {
  // 4 pages of 4 tokens. A holds 2 pages; B (12 tokens, 3 pages) cannot start; C (2 tokens)
  // would fit but must not overtake B.
  Fixture f(test_pool(4, 8, 4), {.max_running_requests = 8, .max_tokens_per_step = 100});
  f.add(7);
  f.step();
  f.add(12);
  f.add(2);
  EXPECT_EQ(plan(f.step()), (Plan{{0, 1}}));
  EXPECT_EQ(f.sched.num_waiting(), 2);
  f.sched.remove(f.reqs[0].get());
  EXPECT_EQ(plan(f.step()), (Plan{{1, 12}, {2, 2}}));  // in order, once B fits
}

TEST(Scheduler, PreemptsTheNewestWhenThePoolRunsOutAndResumesByRecompute) {
  // 3 pages of 4 tokens: A (6 tokens -> 2 pages) and B (3 tokens -> 1 page) fill the pool.
  Fixture f(test_pool(3, 4, 4), {.max_running_requests = 4, .max_tokens_per_step = 100});
  Request* a = f.add(6);
  Request* b = f.add(3);
  EXPECT_EQ(plan(f.step()), (Plan{{0, 6}, {1, 3}}));  // both sample: A has 7 tokens, B 4
  EXPECT_EQ(f.cache.stats().free_pages, 0);
  // Step 2: both compute the token they sampled; B's 4th token still fits its one page.
  EXPECT_EQ(plan(f.step()), (Plan{{0, 1}, {1, 1}}));  // A at 8 tokens, B at 5
  // Step 3: A's 8th token fits its 2 pages; B's 5th needs a second page and none is free:
  // B is the newest running request, so B itself is preempted.
  SchedulerOutput s3 = f.step();
  EXPECT_EQ(plan(s3), (Plan{{0, 1}}));
  ASSERT_EQ(s3.preempted.size(), 1u);
  EXPECT_EQ(s3.preempted[0], b);
  EXPECT_EQ(b->state, RequestState::kWaiting);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_EQ(b->num_output_tokens(), 2);  // generated tokens kept: recomputed with the prompt
  EXPECT_FALSE(f.cache.has(b->seq_id));
  EXPECT_EQ(f.sched.waiting().front(), b);
  // Step 4: A's 9th token takes the page B gave back; B (4 pages' worth) waits.
  EXPECT_EQ(plan(f.step()), (Plan{{0, 1}}));
  EXPECT_EQ(f.cache.stats().free_pages, 0);
  f.sched.remove(a);
  // B resumes over prompt + generated tokens (3 + 2) and samples at the end.
  SchedulerOutput s5 = f.step();
  EXPECT_EQ(plan(s5), (Plan{{1, 5}}));
  EXPECT_TRUE(s5.seqs[0].samples);
  EXPECT_EQ(b->num_output_tokens(), 3);
  EXPECT_EQ(f.sched.num_preemptions(), 1);
}

TEST(Scheduler, PreemptionTakesFromTheTailAndKeepsArrivalOrderInTheQueue) {
  // 5 pages of 2 tokens; A, B, C each 3 tokens (2 pages): C cannot start. A grows until
  // it needs a page held by the newer B.
  Fixture f(test_pool(5, 4, 2), {.max_running_requests = 4, .max_tokens_per_step = 100});
  Request* a = f.add(3);
  Request* b = f.add(3);
  Request* c = f.add(3);
  f.step();  // A, B prefilled (4 pages), C waits; each now 4 tokens
  EXPECT_EQ(f.sched.num_running(), 2);
  f.step();  // A and B compute their 4th token: still 2 pages each
  EXPECT_EQ(f.sched.num_running(), 2);
  f.step();  // 5th token: A takes the last free page; B needs one too: B (the newest) goes
  EXPECT_EQ(f.sched.num_running(), 1);
  ASSERT_EQ(f.sched.num_waiting(), 2);
  EXPECT_EQ(f.sched.waiting()[0], b);  // B before C: it came first
  EXPECT_EQ(f.sched.waiting()[1], c);
  EXPECT_EQ(a->state, RequestState::kRunning);
}

TEST(Scheduler, RemoveFreesPagesAndSlotAtOnce) {
  Fixture f(test_pool(10, 2, 4), {.max_running_requests = 2, .max_tokens_per_step = 100});
  Request* a = f.add(9);
  f.add(2);
  f.step();
  EXPECT_EQ(f.cache.stats().free_pages, 10 - 3 - 1);
  EXPECT_EQ(f.cache.free_slots(), 0);
  f.sched.remove(a);
  EXPECT_EQ(f.cache.stats().free_pages, 10 - 1);
  EXPECT_EQ(f.cache.free_slots(), 1);
  EXPECT_EQ(f.sched.num_running(), 1);
  f.sched.remove(a);  // idempotent
  EXPECT_EQ(f.sched.num_running(), 1);
}

TEST(Scheduler, FullWaitingQueueRejects) {
  CacheManager cache(test_pool(10, 2, 4));
  Scheduler sched({.max_running_requests = 2, .max_tokens_per_step = 100, .max_queued_requests = 1}, cache);
  Request r1, r2;
  r1.prompt_ids = r2.prompt_ids = {1};
  r2.seq_id = 1;
  EXPECT_TRUE(sched.add(&r1).is_ok());
  const Status st = sched.add(&r2);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("--max-queued-requests"), std::string::npos);
}

}  // namespace
}  // namespace moonrun

namespace moonrun {
namespace {

TEST(Scheduler, EveryRunningDecodeGetsATokenEvenWithATinyBudget) {
  Fixture f(test_pool(100, 8, 16), {.max_running_requests = 4, .max_tokens_per_step = 2});
  for (int i = 0; i < 4; ++i) f.add(1);
  EXPECT_EQ(plan(f.step()), (Plan{{0, 1}, {1, 1}, {2, 1}, {3, 1}}));
  EXPECT_EQ(plan(f.step()), (Plan{{0, 1}, {1, 1}, {2, 1}, {3, 1}}));
}

TEST(Scheduler, NoBudgetMeansWholePromptsInOneStep) {
  Fixture f(test_pool(100, 8, 16), {.max_running_requests = 8, .max_tokens_per_step = -1});
  f.add(300);
  f.add(500);
  EXPECT_EQ(plan(f.step()), (Plan{{0, 300}, {1, 500}}));
}

}  // namespace
}  // namespace moonrun

namespace moonrun {
namespace {

// A prompt's chunk that fills the whole budget would leave nothing for a stream that is
// already decoding; the decodes are scheduled first. Prefix caching cuts A's second chunk
// at a 64-token block boundary, which lets B in beside it; A's third chunk (no boundary in
// reach) would take the whole budget of 40.
TEST(Scheduler, DecodesGoBeforeAnOlderPromptsChunks) {
  CacheConfig pool = testing::test_pool(100, 4, 16);
  pool.num_snapshot_slots = 2;
  pool.prefix_block_tokens = 64;
  Fixture f(pool, {.max_running_requests = 4, .max_tokens_per_step = 40});
  Request* a = f.add(200);
  EXPECT_EQ(plan(f.step()), (Plan{{0, 40}}));
  f.add(4);
  EXPECT_EQ(plan(f.step()), (Plan{{0, 24}, {1, 4}}));  // A up to the boundary at 64, B whole
  EXPECT_EQ(plan(f.step()), (Plan{{1, 1}, {0, 39}}));  // B's decode first, A takes the rest
  EXPECT_EQ(plan(f.step()), (Plan{{1, 1}, {0, 25}}));  // A cut at the boundary at 128
  EXPECT_EQ(a->num_computed_tokens, 128);
}

// Fair chunking (issue 47): under --max-prefill-attention-pairs a long prompt's chunks are
// cut so that each step's prefill attends over at most the budget's query-key pairs (the
// largest chunk that fits, found here by counting, not by the scheduler's formula), every
// decode runs in every step, and the prompt still finishes.
TEST(Scheduler, FairChunkingCutsLateChunksToTheAttentionBudgetAndKeepsTheDecodes) {
  constexpr int64_t kBudget = 3'000'000;
  Fixture f(test_pool(1100, 8, 16), {.max_running_requests = 8, .max_tokens_per_step = 2048,
                                     .max_prefill_attention_pairs = kBudget});
  std::vector<Request*> streams = {f.add(5), f.add(7), f.add(3)};
  f.step();  // the three short prompts, then they decode
  Request* longp = f.add(12000);
  auto largest_fitting = [](int64_t past, int64_t most) {
    int64_t n = 0;
    while (n < most && (n + 1) * past + (n + 1) * (n + 2) / 2 <= kBudget) ++n;
    return std::max<int64_t>(n, std::min<int64_t>(most, Scheduler::kMinFairChunkTokens));
  };
  int steps = 0, last_chunk = 1 << 30;
  while (longp->num_computed_tokens < longp->num_prompt_tokens()) {
    ASSERT_LT(++steps, 200) << "the long prompt stopped advancing";
    const int past = longp->num_computed_tokens;
    const SchedulerOutput out = f.step();
    int decodes = 0, chunk = 0;
    for (const ScheduledSeq& s : out.seqs) {
      if (s.req == longp) chunk = s.n_new_tokens;
      else decodes += s.n_new_tokens == 1 ? 1 : 0;
    }
    EXPECT_EQ(decodes, 3) << "step " << steps << ": every stream decodes while the prompt prefills";
    const int64_t tokens_left = std::min<int64_t>(2048 - 3, longp->num_prompt_tokens() - past);
    EXPECT_EQ(chunk, largest_fitting(past, tokens_left)) << "step " << steps << " from " << past;
    EXPECT_LE(Scheduler::attention_pairs(past, chunk), kBudget);
    EXPECT_LE(chunk, last_chunk) << "a later chunk attends over more: it is no longer";
    last_chunk = chunk;
  }
  // The first chunk is the token budget's (2045: its pairs fit), the last ones a few hundred.
  EXPECT_LT(last_chunk, 300);
  EXPECT_GT(steps, 12000 / 2045 + 5);
  for (Request* r : streams) EXPECT_EQ(r->num_output_tokens(), steps + 1);
}

// Two prompts prefilling in one step share the step's budget; under a budget too small for
// even a few tokens a chunk still brings kMinFairChunkTokens, so nothing starves.
TEST(Scheduler, FairChunkingSharesTheBudgetAndAlwaysAdvances) {
  Fixture f(test_pool(400, 8, 16), {.max_running_requests = 8, .max_tokens_per_step = 4096,
                                    .max_prefill_attention_pairs = 100'000});
  Request* a = f.add(3000);
  Request* b = f.add(3000);
  const SchedulerOutput s1 = f.step();
  // a: the largest n with n (n + 1) / 2 <= 100000 is 446; b gets the minimum.
  EXPECT_EQ(plan(s1), (Plan{{0, 446}, {1, Scheduler::kMinFairChunkTokens}}));
  const SchedulerOutput s2 = f.step();
  // a from 446: n * 446 + n (n + 1) / 2 <= 100000 -> 185; b's minimum again.
  EXPECT_EQ(plan(s2), (Plan{{0, 185}, {1, Scheduler::kMinFairChunkTokens}}));
  EXPECT_EQ(a->num_computed_tokens, 631);
  EXPECT_EQ(b->num_computed_tokens, 2 * Scheduler::kMinFairChunkTokens);
}

// A prompt alone on the server keeps whole chunks (there is no one to be fair to: its TTFT
// alone is the baseline); the moment another request arrives, its chunks are cut again.
TEST(Scheduler, FairChunkingLeavesAPromptAloneWhole) {
  Fixture f(test_pool(1100, 8, 16), {.max_running_requests = 8, .max_tokens_per_step = 2048,
                                     .max_prefill_attention_pairs = 100'000});
  Request* longp = f.add(8000);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(plan(f.step()), (Plan{{0, 2048}})) << "step " << i;
  EXPECT_EQ(longp->num_computed_tokens, 3 * 2048);
  f.add(5);
  const SchedulerOutput out = f.step();
  ASSERT_EQ(out.seqs.size(), 2u);
  EXPECT_EQ(out.seqs[0].req, longp);
  EXPECT_EQ(out.seqs[0].n_new_tokens, Scheduler::kMinFairChunkTokens) << "6144 cached: 32 tokens already exceed 1e5 pairs";
}

// A cost model gone wrong for a step (the pacer's fit, ill-conditioned when every step sits
// at the target, can price a pair far too low) must not hand a late chunk the whole token
// budget: a paced prompt's chunk grows by at most kMaxFairChunkGrowth a step, then recovers.
TEST(Scheduler, FairChunkingBoundsAChunkToItsLastTimesTheGrowth) {
  Fixture f(test_pool(1100, 8, 16), {.max_running_requests = 8, .max_tokens_per_step = 4096});
  Request* stream = f.add(5);
  f.step();  // the stream decodes from here on
  Request* longp = f.add(12000);
  // A budget of 3e6 pairs (per token 0, per pair 1): the first chunks are the pairs'.
  f.sched.set_prefill_budget({3e6, 0.0, 1.0});
  int last = 0;
  for (int i = 0; i < 3; ++i) {
    const SchedulerOutput out = f.step();
    ASSERT_EQ(out.seqs.size(), 2u);
    last = out.seqs[1].n_new_tokens;
  }
  ASSERT_LT(last, 1000);
  // The model now prices a pair 1000 times lower: without the bound the chunk would be 4095.
  f.sched.set_prefill_budget({3e6, 0.0, 1e-3});
  for (int i = 0; i < 4; ++i) {
    const SchedulerOutput out = f.step();
    ASSERT_EQ(out.seqs.size(), 2u);
    EXPECT_EQ(out.seqs[0].req, stream);
    const int n = out.seqs[1].n_new_tokens;
    EXPECT_LE(n, static_cast<int>(last * Scheduler::kMaxFairChunkGrowth)) << "step " << i;
    EXPECT_GT(n, last) << "step " << i << ": a chunk cut too short still recovers";
    last = n;
  }
  // The stream finished: the step after is still paced (it may be back; the next test).
  f.sched.remove(stream);
  ASSERT_GT(longp->num_prompt_tokens() - longp->num_computed_tokens, 1000);
  EXPECT_LE(f.step().seqs[0].n_new_tokens, static_cast<int>(last * Scheduler::kMaxFairChunkGrowth));
}

// The pacer's fit can put its fixed part at (or past) the target: every step then sits at
// the target and t0 = target, a = c = 0 explains them all, so target - t0 <= 0. That is a
// step without room (the minimum chunk), not a step without a bound: read as unbounded, the
// long prompt took a whole chunk there (bench/long_prompt_serve.py's ~1 s p99 gaps).
TEST(Scheduler, FairChunkingWithoutRoomGivesTheMinimumChunkNotAWholeOne) {
  Fixture f(test_pool(1100, 8, 16), {.max_running_requests = 8, .max_tokens_per_step = 4096});
  Request* stream = f.add(5);
  f.step();
  f.add(12000);
  f.sched.set_prefill_budget({3e6, 0.0, 1.0});
  f.step();
  for (const double budget : {0.0, -0.004}) {
    f.sched.set_prefill_budget({budget, 1e-6, 1e-9});
    const SchedulerOutput out = f.step();
    ASSERT_EQ(out.seqs.size(), 2u);
    EXPECT_EQ(out.seqs[0].req, stream);
    EXPECT_EQ(out.seqs[1].n_new_tokens, Scheduler::kMinFairChunkTokens) << "budget " << budget;
  }
}

// Streams that end together and send their next request a moment later leave a long prompt
// alone for a step or two. Those steps stay paced: one whole chunk there is a second-long
// stall for every stream's next request (what bench/long_prompt_serve.py's p99 measured).
// Only kFairCompanySteps steps without company make the prompt "alone" again.
TEST(Scheduler, FairChunkingKeepsPacingWhileCompanyMayComeBack) {
  Fixture f(test_pool(2000, 8, 16), {.max_running_requests = 8, .max_tokens_per_step = 2048,
                                     .max_prefill_attention_pairs = 100'000});
  Request* stream = f.add(5);
  Request* longp = f.add(24000);
  for (int i = 0; i < 4; ++i) f.step();
  ASSERT_GT(longp->num_computed_tokens, 0);
  const auto long_chunk = [&](const SchedulerOutput& out) {
    for (const ScheduledSeq& s : out.seqs)
      if (s.req == longp) return s.n_new_tokens;
    return 0;
  };
  // The stream leaves and its next request arrives two steps later.
  f.sched.remove(stream);
  for (int i = 0; i < 2; ++i) EXPECT_LT(long_chunk(f.step()), 2048) << "alone for " << i + 1 << " step(s)";
  Request* next = f.add(5);
  EXPECT_LT(long_chunk(f.step()), 2048);
  f.step();  // the newcomer decodes
  f.sched.remove(next);
  // Alone for good: paced until kFairCompanySteps steps have passed, then whole chunks.
  for (int i = 1; i < Scheduler::kFairCompanySteps; ++i) ASSERT_LT(long_chunk(f.step()), 2048) << "step " << i;
  ASSERT_GT(longp->num_prompt_tokens() - longp->num_computed_tokens, 2048);
  EXPECT_EQ(long_chunk(f.step()), 2048);
}

}  // namespace
}  // namespace moonrun
