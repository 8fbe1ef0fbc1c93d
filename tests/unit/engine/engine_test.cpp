// The whole step loop on a fake model (fake_runner.h): batching, chunking and preemption
// must not change what a request generates.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <map>

#include "fake_runner.h"
#include "test_pool.h"

namespace moonrun {
namespace {

using testing::FakeRunner;
using testing::reference_greedy;

constexpr int kVocab = 48;
constexpr int32_t kEos = 0;

using testing::test_pool;

struct Harness {
  CacheManager cache;
  FakeRunner runner;
  Engine engine;
  Harness(CacheConfig c, SchedulerConfig s, int max_model_len, DetokenizeFn detok = nullptr)
      : cache(c),
        runner(c.num_pages, c.page_size_tokens, c.total_slots(), kVocab),
        engine(EngineConfig{s, max_model_len, {kEos}, 0}, cache, runner, std::move(detok)) {}

  // Runs to completion; collects each (request, index)'s tokens, text and finish reason.
  struct Result {
    std::vector<int32_t> tokens;
    std::string text;
    FinishReason reason = FinishReason::kNone;
    std::string stop_reason;
  };
  std::map<std::pair<uint64_t, int>, Result> run() {
    std::map<std::pair<uint64_t, int>, Result> results;
    std::vector<RequestOutput> outs;
    for (int steps = 0; engine.has_work(); ++steps) {
      const Status st = engine.step(outs);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      if (!st.is_ok() || steps > 100000) break;
    }
    for (const auto& o : outs) {
      Result& r = results[{o.request_id, o.index}];
      r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      r.text += o.text_delta;
      if (o.finished) {
        r.reason = o.finish_reason;
        r.stop_reason = o.stop_reason;
      }
    }
    return results;
  }
};

std::vector<std::vector<int32_t>> test_prompts() {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 7; ++i) {
    std::vector<int32_t> p;
    const int len = 3 + 9 * i;  // 3 .. 57 tokens: several span many chunks and pages
    for (int t = 0; t < len; ++t) p.push_back(1 + (i * 31 + t * 7) % (kVocab - 1));
    prompts.push_back(p);
  }
  return prompts;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

TEST(Engine, GreedyMatchesTheReferenceAloneAndInATightConcurrentBatch) {
  const auto prompts = test_prompts();
  const int max_tokens = 24;
  // Alone, roomy pool, no chunking pressure.
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Harness h(test_pool(64, 4, 16), {.max_running_requests = 4, .max_tokens_per_step = 4096}, 128);
    ASSERT_TRUE(h.engine.add_request(1, prompts[i], greedy(max_tokens)).is_ok());
    auto r = h.run();
    alone.push_back(r[{1, 0}].tokens);
    bool hit_eos = false;
    EXPECT_EQ(alone.back(), reference_greedy(prompts[i], kVocab, max_tokens, kEos, &hit_eos)) << "prompt " << i;
    EXPECT_EQ((r[{1, 0}].reason), hit_eos ? FinishReason::kStop : FinishReason::kLength);
  }
  // Together: 8-token steps (chunked prefill), 4-token pages, a pool of 96 tokens for 7
  // requests of up to 81 tokens: newcomers join decodes, and preemption must happen.
  Harness h(test_pool(24, 8, 4), {.max_running_requests = 8, .max_tokens_per_step = 8}, 96);
  for (size_t i = 0; i < prompts.size(); ++i)
    ASSERT_TRUE(h.engine.add_request(100 + i, prompts[i], greedy(max_tokens)).is_ok());
  auto together = h.run();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ((together[{100 + i, 0}].tokens), alone[i]) << "prompt " << i;
  const EngineStats s = h.engine.stats();
  EXPECT_GT(s.preemptions_total, 0);
  EXPECT_GT(h.runner.max_batch_seqs, 1);
  EXPECT_EQ(s.cache.free_pages, 24);  // everything returned
  EXPECT_EQ(s.cache.free_slots, 8);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
}

TEST(Engine, SeededSamplingIsTheSameAloneAndBatchedAndNFollowsSeedPlusIndex) {
  const auto prompts = test_prompts();
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.9f;
  p.max_tokens = 16;
  p.ignore_eos = true;
  p.seed = 1234;
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < 3; ++i) {
    SamplingParams pi = p;
    pi.seed = 1234 + i;
    Harness h(test_pool(64, 4, 16), {.max_running_requests = 4, .max_tokens_per_step = 4096}, 128);
    ASSERT_TRUE(h.engine.add_request(1, prompts[5], pi).is_ok());
    alone.push_back(h.run()[{1, 0}].tokens);
    EXPECT_EQ(alone.back().size(), 16u);
  }
  EXPECT_NE(alone[0], alone[1]);
  Harness h(test_pool(24, 8, 4), {.max_running_requests = 8, .max_tokens_per_step = 8}, 96);
  p.n = 3;
  ASSERT_TRUE(h.engine.add_request(7, prompts[5], p).is_ok());
  ASSERT_TRUE(h.engine.add_request(8, prompts[6], greedy(20)).is_ok());  // a neighbour
  auto r = h.run();
  for (int i = 0; i < 3; ++i) EXPECT_EQ((r[{7, i}].tokens), alone[i]) << "sample " << i;
}

TEST(Engine, AbortFreesPagesAndSlotBeforeTheNextStep) {
  Harness h(test_pool(32, 4, 4), {.max_running_requests = 4, .max_tokens_per_step = 64}, 100);
  ASSERT_TRUE(h.engine.add_request(1, test_prompts()[4], greedy(50)).is_ok());
  ASSERT_TRUE(h.engine.add_request(2, test_prompts()[1], greedy(50)).is_ok());
  std::vector<RequestOutput> outs;
  ASSERT_TRUE(h.engine.step(outs).is_ok());
  ASSERT_TRUE(h.engine.step(outs).is_ok());
  std::vector<int32_t> tokens2;  // request 2's tokens so far
  for (const auto& o : outs)
    if (o.request_id == 2) tokens2.insert(tokens2.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  const CacheStats before = h.engine.stats().cache;
  const int held = static_cast<int>(h.cache.page_table(0).size());
  outs.clear();
  h.engine.abort_request(1, outs);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_TRUE(outs[0].finished);
  EXPECT_EQ(outs[0].finish_reason, FinishReason::kAbort);
  const CacheStats after = h.engine.stats().cache;
  EXPECT_EQ(after.free_pages, before.free_pages + held);
  EXPECT_EQ(after.free_slots, before.free_slots + 1);
  EXPECT_FALSE(h.engine.has_request(1));
  h.engine.abort_request(1, outs);  // unknown now: nothing
  EXPECT_EQ(outs.size(), 1u);
  auto r = h.run();
  tokens2.insert(tokens2.end(), r[{2, 0}].tokens.begin(), r[{2, 0}].tokens.end());
  EXPECT_EQ(tokens2, reference_greedy(test_prompts()[1], kVocab, 50, kEos));
}

// Token t decodes to the letter 'a' + t % 26.
std::string letters(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t t : ids) s.push_back(static_cast<char>('a' + t % 26));
  return s;
}

TEST(Engine, StopConditions) {
  const auto prompt = test_prompts()[2];
  const auto ref = reference_greedy(prompt, kVocab, 40, /*eos=*/-1);
  const std::string ref_text = letters(ref);
  {  // a stop string: text cut before it, tokens up to the one completing it
    Harness h(test_pool(64, 4, 16), {.max_running_requests = 4, .max_tokens_per_step = 4096}, 128, letters);
    SamplingParams p = greedy(40);
    p.ignore_eos = true;
    const std::string stop = ref_text.substr(10, 2);
    p.stop = {stop};
    ASSERT_TRUE(h.engine.add_request(1, prompt, p).is_ok());
    auto r = h.run()[{1, 0}];
    const size_t at = ref_text.find(stop);
    EXPECT_EQ(r.reason, FinishReason::kStop);
    EXPECT_EQ(r.stop_reason, stop);
    EXPECT_EQ(r.text, ref_text.substr(0, at));
    EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + at + 2));
  }
  {  // a stop token: in the ids, not in the text
    Harness h(test_pool(64, 4, 16), {.max_running_requests = 4, .max_tokens_per_step = 4096}, 128, letters);
    SamplingParams p = greedy(40);
    p.ignore_eos = true;
    p.stop_token_ids = {ref[5]};
    ASSERT_TRUE(h.engine.add_request(1, prompt, p).is_ok());
    auto r = h.run()[{1, 0}];
    const size_t at = std::find(ref.begin(), ref.end(), ref[5]) - ref.begin();
    EXPECT_EQ(r.reason, FinishReason::kStop);
    EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + at + 1));
    EXPECT_EQ(r.text, ref_text.substr(0, at));
  }
  {  // max_tokens
    Harness h(test_pool(64, 4, 16), {.max_running_requests = 4, .max_tokens_per_step = 4096}, 128, letters);
    SamplingParams p = greedy(7);
    p.ignore_eos = true;
    ASSERT_TRUE(h.engine.add_request(1, prompt, p).is_ok());
    auto r = h.run()[{1, 0}];
    EXPECT_EQ(r.reason, FinishReason::kLength);
    EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + 7));
    EXPECT_EQ(r.text, ref_text.substr(0, 7));
  }
  {  // no max_tokens: the context length ends it
    Harness h(test_pool(64, 4, 16), {.max_running_requests = 4, .max_tokens_per_step = 4096}, 30, letters);
    SamplingParams p = greedy(-1);
    p.ignore_eos = true;
    ASSERT_TRUE(h.engine.add_request(1, prompt, p).is_ok());
    auto r = h.run()[{1, 0}];
    EXPECT_EQ(r.reason, FinishReason::kLength);
    EXPECT_EQ(r.tokens.size(), 30 - prompt.size());
  }
}

TEST(Engine, SkippedSpecialTokensStayInTheIdsButAddNoText) {
  const auto prompt = test_prompts()[3];
  const auto ref = reference_greedy(prompt, kVocab, 12, /*eos=*/-1);
  const int32_t special = ref[2];
  for (bool skip : {true, false}) {
    CacheConfig c = test_pool(64, 4, 16);
    CacheManager cache(c);
    FakeRunner runner(c.num_pages, c.page_size_tokens, c.total_slots(), kVocab);
    EngineConfig config{{.max_running_requests = 4, .max_tokens_per_step = 4096}, 128, {kEos}, 0};
    config.is_special_token = [special](int32_t id) { return id == special; };
    Engine engine(config, cache, runner, letters);
    SamplingParams p = greedy(12);
    p.ignore_eos = true;
    p.skip_special_tokens = skip;
    ASSERT_TRUE(engine.add_request(1, prompt, p).is_ok());
    std::vector<RequestOutput> outs;
    while (engine.has_work()) ASSERT_TRUE(engine.step(outs).is_ok());
    std::string text;
    std::vector<int32_t> ids;
    for (const auto& o : outs) {
      text += o.text_delta;
      ids.insert(ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
    std::vector<int32_t> kept;
    for (int32_t t : ref)
      if (!skip || t != special) kept.push_back(t);
    EXPECT_EQ(ids, ref);
    EXPECT_EQ(text, letters(kept)) << "skip " << skip;
  }
}

TEST(Engine, ValidationAndQueueLimits) {
  Harness h(test_pool(64, 4, 16), {.max_running_requests = 4, .max_tokens_per_step = 64, .max_queued_requests = 2}, 32);
  EXPECT_EQ(h.engine.add_request(1, {}, greedy(4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.engine.add_request(1, {1, kVocab}, greedy(4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.engine.add_request(1, std::vector<int32_t>(30, 1), greedy(3)).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(h.engine.add_request(1, std::vector<int32_t>(32, 1), greedy(-1)).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(h.engine.add_request(1, {1, 2}, greedy(4)).is_ok());
  EXPECT_EQ(h.engine.add_request(1, {1, 2}, greedy(4)).code(), StatusCode::kInvalidArgument);  // duplicate id
  EXPECT_TRUE(h.engine.add_request(2, {1, 2}, greedy(4)).is_ok());
  EXPECT_EQ(h.engine.add_request(3, {1, 2}, greedy(4)).code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(check_engine_config(EngineConfig{{}, 2000, {}, 0}, test_pool(64, 4, 16)).is_ok());  // > 1024 tokens
}

TEST(Engine, BackendFailureIsAStatusNotAHang) {
  Harness h(test_pool(64, 4, 16), {.max_running_requests = 4, .max_tokens_per_step = 64}, 64);
  h.runner.fail_at_forward = 2;
  SamplingParams p = greedy(10);
  p.ignore_eos = true;
  ASSERT_TRUE(h.engine.add_request(1, {1, 2, 3}, p).is_ok());
  std::vector<RequestOutput> outs;
  EXPECT_TRUE(h.engine.step(outs).is_ok());
  EXPECT_TRUE(h.engine.step(outs).is_ok());
  const Status st = h.engine.step(outs);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  outs.clear();
  h.engine.fail_all(st, outs);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].finish_reason, FinishReason::kError);
  EXPECT_FALSE(outs[0].error.is_ok());
  EXPECT_FALSE(h.engine.has_work());
  EXPECT_EQ(h.engine.stats().cache.free_pages, 64);
}

}  // namespace
}  // namespace moonrun

namespace moonrun {
namespace {

TEST(Engine, LogprobsTravelWithTheirTokens) {
  Harness h(test_pool(64, 4, 16), {.max_running_requests = 4, .max_tokens_per_step = 4096}, 128);
  SamplingParams p = greedy(5);
  p.ignore_eos = true;
  p.logprobs = 3;
  const auto prompt = test_prompts()[1];
  ASSERT_TRUE(h.engine.add_request(1, prompt, p).is_ok());
  std::vector<RequestOutput> outs;
  while (h.engine.has_work()) ASSERT_TRUE(h.engine.step(outs).is_ok());
  std::vector<int32_t> context = prompt;
  std::vector<float> logits(kVocab);
  for (const RequestOutput& o : outs) {
    ASSERT_EQ(o.new_token_ids.size(), 1u);
    ASSERT_EQ(o.logprobs.size(), 1u);
    // The greedy token is the most likely one, and its logprob is log_softmax of the
    // fake model's logits for this context.
    testing::fake_logits(testing::digest_of(context), kVocab, logits.data());
    const std::vector<float> lp = cpu::log_softmax(logits.data(), kVocab);
    EXPECT_EQ(o.logprobs[0].token, o.new_token_ids[0]);
    EXPECT_FLOAT_EQ(o.logprobs[0].logprob, lp[o.new_token_ids[0]]);
    ASSERT_EQ(o.logprobs[0].top.size(), 3u);
    EXPECT_EQ(o.logprobs[0].top[0].token, o.new_token_ids[0]);
    context.push_back(o.new_token_ids[0]);
  }
  EXPECT_EQ(outs.size(), 5u);
}

TEST(Engine, AbortEndsEverySampleOfARequest) {
  Harness h(test_pool(64, 8, 16), {.max_running_requests = 8, .max_tokens_per_step = 4096}, 128);
  SamplingParams p;
  p.n = 3;
  p.ignore_eos = true;
  p.max_tokens = 50;
  ASSERT_TRUE(h.engine.add_request(9, test_prompts()[0], p).is_ok());
  std::vector<RequestOutput> outs;
  ASSERT_TRUE(h.engine.step(outs).is_ok());
  EXPECT_EQ(h.engine.stats().cache.free_slots, 5);
  outs.clear();
  h.engine.abort_request(9, outs);
  ASSERT_EQ(outs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(outs[i].index, i);
    EXPECT_EQ(outs[i].finish_reason, FinishReason::kAbort);
  }
  EXPECT_EQ(h.engine.stats().cache.free_slots, 8);
  EXPECT_FALSE(h.engine.has_work());
}

}  // namespace
}  // namespace moonrun
