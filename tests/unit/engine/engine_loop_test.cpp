// The threaded face of the engine: many clients at once, abort, failure, drain.
#include "engine/engine_loop.h"

#include <gtest/gtest.h>

#include <thread>

#include "fake_runner.h"
#include "test_pool.h"

namespace moonrun {
namespace {

using namespace std::chrono_literals;
using testing::FakeRunner;
using testing::reference_greedy;

constexpr int kVocab = 48;
constexpr int32_t kEos = 0;

struct Built {
  std::unique_ptr<EngineLoop> loop;
  FakeRunner* runner = nullptr;
};

Built build(int num_pages, int num_slots, int page_size, SchedulerConfig s, int max_model_len) {
  const CacheConfig c = testing::test_pool(num_pages, num_slots, page_size);
  auto cache = std::make_unique<CacheManager>(c);
  auto runner = std::make_unique<FakeRunner>(num_pages, page_size, c.total_slots(), kVocab);
  Built b;
  b.runner = runner.get();
  auto loop = EngineLoop::create(EngineConfig{s, max_model_len, {kEos}, 0}, std::move(cache), std::move(runner), nullptr);
  EXPECT_TRUE(loop.is_ok()) << loop.status().to_string();
  b.loop = std::move(loop).value();
  EXPECT_TRUE(b.loop->start().is_ok());
  return b;
}

// Reads a stream to its end; returns the tokens of sample 0 and the last finish reason.
std::vector<int32_t> drain(RequestStream& s, FinishReason* reason = nullptr, Status* error = nullptr) {
  std::vector<int32_t> tokens;
  RequestOutput out;
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!s.done() && std::chrono::steady_clock::now() < deadline) {
    if (!s.next(out, 50ms)) continue;
    tokens.insert(tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    if (out.finished && reason) *reason = out.finish_reason;
    if (out.finished && error) *error = out.error;
  }
  EXPECT_TRUE(s.done()) << "stream did not finish";
  return tokens;
}

std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  for (int t = 0; t < 2 + (i * 5) % 40; ++t) p.push_back(1 + (i * 13 + t * 11) % (kVocab - 1));
  return p;
}

TEST(EngineLoop, ConcurrentClientsGetExactlyTheirOwnGreedyOutputs) {
  // 24 clients on 8 slots and a pool of 160 tokens: queueing, chunking and preemption.
  Built b = build(40, 8, 4, {.max_running_requests = 8, .max_tokens_per_step = 16}, 96);
  b.runner->forward_delay = 1ms;  // requests overlap even if the client threads start slowly
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 20;
  std::vector<std::thread> clients;
  std::vector<std::vector<int32_t>> got(24);
  for (int i = 0; i < 24; ++i) {
    clients.emplace_back([&, i] {
      auto s = b.loop->submit(prompt_of(i), p);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      got[i] = drain(**s);
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(got[i], reference_greedy(prompt_of(i), kVocab, 20, kEos)) << "client " << i;
  EXPECT_GT(b.runner->max_batch_seqs, 1);
  const EngineStats s = b.loop->stats();
  EXPECT_EQ(s.cache.free_pages, 40);
  EXPECT_EQ(s.requests_finished_total, 24);
  EXPECT_TRUE(b.loop->alive());
}

TEST(EngineLoop, AbortEndsTheStreamAndFreesTheCache) {
  Built b = build(128, 4, 4, {.max_running_requests = 4, .max_tokens_per_step = 64}, 500);
  b.runner->forward_delay = 5ms;
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  auto s = b.loop->submit(prompt_of(3), p);  // runs until the context is full
  ASSERT_TRUE(s.is_ok());
  RequestOutput out;
  ASSERT_TRUE((*s)->next(out, 5s));  // it is running
  b.loop->abort((*s)->id());
  FinishReason reason = FinishReason::kNone;
  drain(**s, &reason);
  EXPECT_EQ(reason, FinishReason::kAbort);
  for (int i = 0; i < 200 && b.loop->stats().cache.free_pages != 128; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(b.loop->stats().cache.free_pages, 128);
  EXPECT_EQ(b.loop->stats().cache.free_slots, 4);
}

TEST(EngineLoop, SubmitErrorsComeBackAtOnce) {
  Built b = build(40, 4, 4, {.max_running_requests = 4, .max_tokens_per_step = 64, .max_queued_requests = 64}, 32);
  SamplingParams p;
  p.max_tokens = 40;
  EXPECT_EQ(b.loop->submit({1, 2}, p).status().code(), StatusCode::kOutOfRange);
  p.max_tokens = 0;
  EXPECT_EQ(b.loop->submit({1, 2}, p).status().code(), StatusCode::kInvalidArgument);
  b.loop->begin_drain();
  p.max_tokens = 2;
  EXPECT_EQ(b.loop->submit({1, 2}, p).status().code(), StatusCode::kUnavailable);
}

TEST(EngineLoop, ABackendFailureFailsEveryPendingRequestAndTheEngineStaysDown) {
  Built b = build(128, 2, 4, {.max_running_requests = 2, .max_tokens_per_step = 64}, 400);
  b.runner->forward_delay = 2ms;  // 5 x 300 tokens, 2 at a time: seconds of work
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = 300;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 5; ++i) {  // two run, three wait
    auto s = b.loop->submit(prompt_of(i), p);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  b.runner->fail_at_forward = 0;  // the backend breaks now
  for (auto& s : streams) {
    FinishReason reason = FinishReason::kNone;
    Status error;
    drain(*s, &reason, &error);
    EXPECT_EQ(reason, FinishReason::kError);
    EXPECT_EQ(error.code(), StatusCode::kInternal);
  }
  for (int i = 0; i < 200 && b.loop->alive(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(b.loop->alive());
  EXPECT_EQ(b.loop->submit({1}, p).status().code(), StatusCode::kUnavailable);
}

TEST(EngineLoop, StopEndsWhateverIsLeftAsAborted) {
  Built b = build(128, 2, 4, {.max_running_requests = 2, .max_tokens_per_step = 64}, 500);
  b.runner->forward_delay = 5ms;
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  auto s = b.loop->submit({1, 2, 3}, p);
  ASSERT_TRUE(s.is_ok());
  b.loop->stop();
  FinishReason reason = FinishReason::kNone;
  drain(**s, &reason);
  EXPECT_EQ(reason, FinishReason::kAbort);
}

}  // namespace
}  // namespace moonrun
