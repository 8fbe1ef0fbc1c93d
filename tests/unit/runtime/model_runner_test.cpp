// The runner (runtime/model_runner.h) on the CPU backend with real checkpoints:
//   - a sequence alone and inside batches of 1, 7 and 32 sequences, prefill chunks and
//     decode tokens mixed in every step, gives the same greedy tokens and logits;
//   - the engine over it (scheduler, pages, slots, chunked prefill, preemption) gives what
//     `generate` gives for each prompt alone, and the same seed the same sampled tokens;
//   - the prefix cache serves a repeated 4k-token prefix without recomputing it;
//   - bad batches are errors, not crashes.
#include "runtime/model_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>
#include <unistd.h>

#include "../../support/batch_runs.h"
#include "../../support/fixture_files.h"
#include "../../support/host_tensors.h"
#include "../../support/runtimes.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "model/demo_model.h"
#include "runtime/generate.h"

namespace moonrun {
namespace {

using namespace std::chrono_literals;
using testing::make_runtime;
using testing::test_runtime_options;

const std::string& demo_dir() {
  static const std::string dir = [] {
    const std::string d =
        (std::filesystem::temp_directory_path() / ("moonrun_runner_test_" + std::to_string(getpid()))).string();
    const Status st = write_demo_model(d, 1024);
    MR_CHECK(st.is_ok()) << st.to_string();
    return d;
  }();
  return dir;
}

void expect_batching_changes_nothing(const std::string& dir, int vocab) {
  using testing::run_alone;
  using testing::run_batched;
  using testing::SeqResult;
  const int n_seqs = 32, max_tokens = 8;
  const RuntimeOptions ro = test_runtime_options("cpu", 0);
  const std::vector<SeqResult> alone = run_alone(dir, n_seqs, max_tokens, vocab, ro);
  ASSERT_EQ(alone.size(), static_cast<size_t>(n_seqs));
  for (int batch : {1, 7, 32}) {
    const std::vector<SeqResult> got = run_batched(dir, n_seqs, max_tokens, batch, vocab, ro);
    double worst = 0;
    for (int i = 0; i < n_seqs; ++i) {
      EXPECT_EQ(got[i].tokens, alone[i].tokens) << "sequence " << i << " in batches of " << batch;
      ASSERT_EQ(got[i].logits.size(), alone[i].logits.size());
      worst = std::max(worst, testing::max_abs_diff(got[i].logits, alone[i].logits));
    }
    // fp32 rounding at most: the CPU backend computes every row alone.
    EXPECT_LE(worst, 1e-5) << "batches of " << batch;
    std::printf("%s, batches of %d: max |dlogit| vs alone = %g\n", dir.c_str(), batch, worst);
  }
}

TEST(ModelRunner, AloneEqualsBatchesOf1And7And32MixedPrefillAndDecode) {
  expect_batching_changes_nothing(demo_dir(), 1024 + 256);
}

TEST(ModelRunner, AloneEqualsBatchesOnAReferenceFixture) {
  expect_batching_changes_nothing(fixtures::fixtures_dir() + "/k3-tiny-a", 512);
}

// --kv-cache-dtype fp8 through the whole runtime on a reference fixture with MLA layers:
// the pool really holds e4m3 (the prompt's logits move against the float32 cache's) by a
// bounded amount, and batching still changes nothing. kimi-linear-tiny (KDA + MLA, plain
// MoE): its routing holds under this perturbation, so the move measures the cache. (On the
// K3 tiny fixtures it flips routing decisions and moves logits by as much as bf16 compute
// does, tests/fixtures/README.md; the layer-level bound is MlaLayer.Fp8CacheIsTheLayerOverRoundedRows.)
TEST(ModelRunner, Fp8KvCacheOnAReferenceFixture) {
  const std::string dir = fixtures::fixtures_dir() + "/kimi-linear-tiny";
  const int vocab = 512, n_seqs = 12, max_tokens = 6;
  RuntimeOptions f32 = test_runtime_options("cpu", 0), fp8 = f32;
  fp8.kv_cache_dtype = "fp8";
  const std::vector<testing::SeqResult> exact = testing::run_alone(dir, n_seqs, max_tokens, vocab, f32);
  const std::vector<testing::SeqResult> e4m3 = testing::run_alone(dir, n_seqs, max_tokens, vocab, fp8);
  ASSERT_EQ(exact.size(), e4m3.size());
  double worst = 0, range = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    // The first step's logits: the prompt alone decides them (later ones follow the tokens).
    const std::vector<float> a(exact[i].logits.begin(), exact[i].logits.begin() + vocab);
    const std::vector<float> b(e4m3[i].logits.begin(), e4m3[i].logits.begin() + vocab);
    worst = std::max(worst, testing::max_abs_diff(a, b));
    range = std::max(range, testing::max_abs(a));
  }
  std::printf("fp8 KV cache, kimi-linear-tiny: prompt logits within %.4f of the float32 cache's (largest |logit| %.2f)\n",
              worst, range);
  EXPECT_GT(worst, 1e-5) << "the fp8 cache changes nothing: is it in effect?";
  EXPECT_LT(worst, 0.05 * range);
  const std::vector<testing::SeqResult> batched = testing::run_batched(dir, n_seqs, max_tokens, 7, vocab, fp8);
  ASSERT_EQ(batched.size(), e4m3.size());
  for (size_t i = 0; i < e4m3.size(); ++i) {
    EXPECT_EQ(batched[i].tokens, e4m3[i].tokens) << "sequence " << i;
    EXPECT_LE(testing::max_abs_diff(batched[i].logits, e4m3[i].logits), 1e-5) << "sequence " << i;
  }
}

// ---- the engine over the runner ---------------------------------------------------------

std::vector<int32_t> engine_prompt(int i) {
  std::vector<int32_t> ids;
  const int n = 3 + 11 * i;  // 3 .. 47 tokens
  for (int t = 0; t < n; ++t) ids.push_back((i * 97 + t * 37 + 11) % 1024);
  return ids;
}

// Each prompt alone through generate(): what the batched engine must reproduce.
std::vector<std::vector<int32_t>> generate_alone(int n_prompts, const GenerateOptions& opt) {
  std::vector<std::vector<int32_t>> want;
  Runtime rt = make_runtime(demo_dir(), test_runtime_options("cpu", 256));
  if (!rt.runner) return want;
  for (int i = 0; i < n_prompts; ++i) {
    auto r = generate(*rt.runner, rt.cache.page_size_tokens, engine_prompt(i), opt);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r.is_ok()) break;
    want.push_back(r->token_ids);
  }
  return want;
}

EngineConfig engine_config(const Runtime& rt, int max_running, int chunk, int max_model_len) {
  EngineConfig c;
  c.scheduler = {.max_running_requests = max_running, .max_tokens_per_step = chunk};
  c.max_model_len = max_model_len;
  return c;  // no EOS: generate() does not stop at one either
}

TEST(ModelRunner, ConcurrentEngineRequestsEqualGenerateAlone) {
  const int n_prompts = 5, max_tokens = 8;
  GenerateOptions opt;
  opt.max_tokens = max_tokens;
  const auto want = generate_alone(n_prompts, opt);
  ASSERT_EQ(want.size(), static_cast<size_t>(n_prompts));
  RuntimeOptions ro = test_runtime_options("cpu", 1024, 4);  // 5 clients: one waits and joins running decodes
  Runtime rt = make_runtime(demo_dir(), ro);
  ASSERT_TRUE(rt.runner);
  auto loop = EngineLoop::create(engine_config(rt, 4, 64, 512), std::make_unique<CacheManager>(rt.cache),
                                 std::move(rt.runner), nullptr);
  ASSERT_TRUE(loop.is_ok()) << loop.status().to_string();
  ASSERT_TRUE((*loop)->start().is_ok());
  std::vector<std::vector<int32_t>> got(n_prompts);
  std::vector<std::thread> clients;
  for (int i = 0; i < n_prompts; ++i) {
    clients.emplace_back([&, i] {
      SamplingParams p;
      p.temperature = 0;
      p.max_tokens = max_tokens;
      auto s = (*loop)->submit(engine_prompt(i), p);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      RequestOutput out;
      const auto deadline = std::chrono::steady_clock::now() + 120s;
      while (!(*s)->done() && std::chrono::steady_clock::now() < deadline) {
        if (!(*s)->next(out, 50ms)) continue;
        EXPECT_TRUE(out.error.is_ok()) << out.error.to_string();
        got[i].insert(got[i].end(), out.new_token_ids.begin(), out.new_token_ids.end());
      }
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < n_prompts; ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  EXPECT_TRUE((*loop)->alive());
  EXPECT_EQ((*loop)->stats().cache.free_slots, 4);
}

// Chunked prefill (16-token steps) and preemption (a pool of 96 tokens for 5 requests of up
// to 55) change the order of float operations (prefill chunks split differently, preempted
// requests recompute their generated tokens as a prefill), not the math: on the demo model
// the greedy tokens stay those of generate().
TEST(ModelRunner, ChunkingAndPreemptionKeepGreedyOutputs) {
  const int n_prompts = 5, max_tokens = 8;
  GenerateOptions opt;
  opt.max_tokens = max_tokens;
  const auto want = generate_alone(n_prompts, opt);
  ASSERT_EQ(want.size(), static_cast<size_t>(n_prompts));
  RuntimeOptions ro = test_runtime_options("cpu", 96, 5);
  ro.page_size_tokens = 8;
  Runtime rt = make_runtime(demo_dir(), ro);
  ASSERT_TRUE(rt.runner);
  ASSERT_EQ(rt.cache.num_pages, 12);
  CacheManager cache(rt.cache);
  Engine engine(engine_config(rt, 5, 16, 96), cache, *rt.runner, nullptr);
  for (int i = 0; i < n_prompts; ++i) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = max_tokens;
    ASSERT_TRUE(engine.add_request(i, engine_prompt(i), p).is_ok());
  }
  std::vector<std::vector<int32_t>> got(n_prompts);
  std::vector<RequestOutput> outs;
  while (engine.has_work()) {
    const Status st = engine.step(outs);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  for (const RequestOutput& o : outs)
    got[o.request_id].insert(got[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  for (int i = 0; i < n_prompts; ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  EXPECT_GT(engine.stats().preemptions_total, 0);
  EXPECT_EQ(engine.stats().cache.free_pages, 12);
}

// Fair chunking (--max-prefill-attention-pairs): prompts of 135-190 tokens cut into chunks
// of 32-62 tokens by a budget of 2,000 query-key pairs a step, three prefilling at once and
// sharing it: the same greedy tokens as each prompt alone in one chunk.
TEST(ModelRunner, FairChunkingKeepsGreedyOutputs) {
  GenerateOptions opt;
  opt.max_tokens = 6;
  const std::vector<int> which = {12, 15, 17};
  Runtime alone = make_runtime(demo_dir(), test_runtime_options("cpu", 256));
  ASSERT_TRUE(alone.runner);
  std::vector<std::vector<int32_t>> want;
  for (int i : which) {
    auto r = generate(*alone.runner, alone.cache.page_size_tokens, engine_prompt(i), opt);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    want.push_back(r->token_ids);
  }
  Runtime rt = make_runtime(demo_dir(), test_runtime_options("cpu", 256, 3));
  ASSERT_TRUE(rt.runner);
  CacheManager cache(rt.cache);
  EngineConfig ec = engine_config(rt, 3, 512, 256);
  ec.scheduler.max_prefill_attention_pairs = 2000;
  Engine engine(ec, cache, *rt.runner, nullptr);
  for (size_t k = 0; k < which.size(); ++k) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = opt.max_tokens;
    ASSERT_TRUE(engine.add_request(static_cast<int64_t>(k), engine_prompt(which[k]), p).is_ok());
  }
  std::vector<std::vector<int32_t>> got(which.size());
  std::vector<RequestOutput> outs;
  int steps = 0;
  while (engine.has_work()) {
    const Status st = engine.step(outs);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ++steps;
  }
  for (const RequestOutput& o : outs)
    got[o.request_id].insert(got[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  for (size_t k = 0; k < which.size(); ++k) EXPECT_EQ(got[k], want[k]) << "prompt " << which[k];
  // 190 tokens in chunks of at most 62, then 6 tokens: more than 190 / 62 + 6 steps.
  EXPECT_GT(steps, 9);
}

// One sampler: a seeded request gives `generate`'s tokens for the same seed (sample i of
// n uses seed + i, as in vLLM).
TEST(ModelRunner, SameSeedSameTokensFromGenerateAndTheEngine) {
  GenerateOptions opt;
  opt.max_tokens = 12;
  opt.sampling.temperature = 1.3f;
  opt.sampling.top_p = 0.95f;
  opt.sampling.top_k = 50;
  opt.sampling.seed = 1234;
  const auto want = generate_alone(3, opt);
  ASSERT_EQ(want.size(), 3u);
  Runtime rt = make_runtime(demo_dir(), test_runtime_options("cpu", 512, 4));
  ASSERT_TRUE(rt.runner);
  CacheManager cache(rt.cache);
  Engine engine(engine_config(rt, 4, 256, 256), cache, *rt.runner, nullptr);
  for (int i = 0; i < 3; ++i) {
    SamplingParams p = opt.sampling;
    p.max_tokens = opt.max_tokens;
    ASSERT_TRUE(engine.add_request(i, engine_prompt(i), p).is_ok());
  }
  std::vector<std::vector<int32_t>> got(3);
  std::vector<RequestOutput> outs;
  while (engine.has_work()) ASSERT_TRUE(engine.step(outs).is_ok());
  for (const RequestOutput& o : outs)
    got[o.request_id].insert(got[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  // And the draws are not trivially greedy: another seed differs.
  GenerateOptions other = opt;
  other.sampling.seed = 99;
  EXPECT_NE(generate_alone(1, other)[0], want[0]);
}

// ---- the prefix cache ---------------------------------------------------------------------

// Two requests share a 4096-token prefix: the second computes only its own tail, and its
// tokens are those of a server without a prefix cache.
TEST(ModelRunner, PrefixCacheServesARepeated4kPrefixWithoutRecomputingIt) {
  const int kPrefix = 4096, kTail = 12, kMaxTokens = 6;
  std::vector<int32_t> prefix;
  for (int t = 0; t < kPrefix; ++t) prefix.push_back((t * 131 + 7) % 1024);
  auto with_tail = [&](int salt) {
    std::vector<int32_t> p = prefix;
    for (int t = 0; t < kTail; ++t) p.push_back((salt * 53 + t * 11) % 1024);
    return p;
  };
  const auto a = with_tail(1), b = with_tail(2);

  auto serve = [&](bool prefix_cache, const std::vector<std::vector<int32_t>>& prompts,
                   std::vector<int>* cached, int64_t* computed_last) {
    RuntimeOptions ro = test_runtime_options("cpu", 2 * (kPrefix + kTail + kMaxTokens) + 64, 2);
    ro.prefix_cache = prefix_cache;
    ro.prefix_block_tokens = 256;
    ro.prefix_snapshot_slots = 4;
    Runtime rt = make_runtime(demo_dir(), ro);
    MR_CHECK(rt.runner != nullptr);
    CacheManager cache(rt.cache);
    Engine engine(engine_config(rt, 2, 2048, kPrefix + kTail + kMaxTokens), cache, *rt.runner, nullptr);
    std::vector<std::vector<int32_t>> tokens(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t before = rt.runner->stats().tokens_computed;
      SamplingParams p;
      p.temperature = 0;
      p.max_tokens = kMaxTokens;
      EXPECT_TRUE(engine.add_request(i, prompts[i], p).is_ok());
      std::vector<RequestOutput> outs;
      while (engine.has_work()) EXPECT_TRUE(engine.step(outs).is_ok());
      for (const RequestOutput& o : outs) {
        tokens[i].insert(tokens[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (o.finished && cached) cached->push_back(o.num_cached_tokens);
      }
      if (computed_last) *computed_last = rt.runner->stats().tokens_computed - before;
    }
    return tokens;
  };

  const auto want = serve(false, {b}, nullptr, nullptr);
  std::vector<int> cached;
  int64_t computed_b = 0;
  const auto got = serve(true, {a, b}, &cached, &computed_b);
  ASSERT_EQ(cached.size(), 2u);
  EXPECT_EQ(cached[0], 0);
  EXPECT_EQ(cached[1], kPrefix);
  // b's prompt tail and its decode steps only: not the 4096 shared tokens again.
  EXPECT_EQ(computed_b, kTail + kMaxTokens - 1);
  EXPECT_EQ(got[1], want[0]);
}

// ---- errors --------------------------------------------------------------------------------

TEST(ModelRunner, BadBatchesAreErrorsNotCrashes) {
  Runtime rt = make_runtime(demo_dir(), test_runtime_options("cpu", 64, 1));
  ASSERT_TRUE(rt.runner);
  const std::vector<int32_t> pages = {0};
  auto step = [&](std::vector<int32_t> ids, int n_past, int slot) {
    StepInput in;
    StepSeq s;
    s.new_token_ids = ids;
    s.n_past = n_past;
    s.state_slot = slot;
    s.pages = pages;
    in.seqs.push_back(s);
    StepOutput out;
    return rt.runner->step(in, out);
  };
  Status st = step({1, rt.config.vocab_size}, 0, 0);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  EXPECT_EQ(step({1}, 0, 5).code(), StatusCode::kInvalidArgument);    // no such slot
  EXPECT_EQ(step({1}, 100, 0).code(), StatusCode::kInvalidArgument);  // 101 tokens on one 16-token page
  EXPECT_TRUE(step({1}, 0, 0).is_ok());                               // and the runner still works
}

}  // namespace
}  // namespace moonrun
