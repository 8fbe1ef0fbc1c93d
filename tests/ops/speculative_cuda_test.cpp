// Speculative decoding on the CUDA backend, the GPU counterpart of
// tests/unit/runtime/speculative_test.cpp. A verify step's sequences (the last token and k
// drafts) take the decode-path kernels (recurrent KDA, absorbed MLA, batch tables read on the
// device) and, when every sequence brings the same number, a captured graph. In fp32 on every
// reference fixture and the demo model:
//   - greedy tokens with n-gram drafts are the tokens without them, one request at a time
//     (every verify step a graph) and four at a time (mixed steps, eager);
//   - verify steps replayed from graphs give what the same steps give eagerly;
//   - a rollback after accepting j of k drafts leaves the state a step over the accepted
//     tokens alone leaves (to fp32 rounding: cuBLAS may pick other kernels for other row
//     counts, so not bit for bit as on the CPU).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/fixture_files.h"
#include "../support/runtimes.h"
#include "engine/engine.h"
#include "op_test_util.h"
#include "runtime/model_runner.h"

namespace moonrun {
namespace {

std::vector<std::vector<int32_t>> prompts_for(const std::string& dir, int vocab) {
  std::vector<std::vector<int32_t>> prompts;
  std::ifstream in(dir + "/expected.json");
  for (const auto& c : nlohmann::json::parse(in).at("cases")) prompts.push_back(c.at("prompt_ids").get<std::vector<int32_t>>());
  for (int i = 0; i < 6; ++i) {  // repeated patterns: drafts found, kept and rejected
    std::vector<int32_t> pattern, p;
    for (int t = 0; t < 3 + 2 * i; ++t) pattern.push_back((t * 131 + i * 17 + 5) % vocab);
    for (int r = 0; r < 3; ++r) p.insert(p.end(), pattern.begin(), pattern.end());
    p.push_back(pattern[0]);
    prompts.push_back(p);
  }
  return prompts;
}

struct SpecRun {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
  int64_t graph_replays = 0;
};

SpecRun run(const std::string& dir, const std::vector<std::vector<int32_t>>& prompts, int k, int max_running, bool graphs,
            const std::string& dspark_draft = "") {
  SpecRun r;
  RuntimeOptions ro = testing::test_runtime_options("cuda", 4096, max_running);
  ro.mem_fraction_static = 0.2;
  ro.dtype = "float32";
  ro.cuda_graphs = graphs;
  ro.num_speculative_tokens = k;
  if (k > 0) ro.draft_model = dspark_draft;
  Runtime rt = testing::make_runtime(dir, ro);
  if (!rt.runner) return r;
  CacheManager cache(rt.cache);
  EngineConfig ec;
  ec.scheduler = {.max_running_requests = max_running, .max_tokens_per_step = 256};
  ec.max_model_len = 1024;
  if (k > 0) ec.speculative = {SpecMethod::kNgram, k, 1, 4, 0};
  if (k > 0 && !dspark_draft.empty()) {
    ec.speculative.method = SpecMethod::kDSpark;
    ec.speculative.draft_model = dspark_draft;
  }
  Engine engine(ec, cache, *rt.runner, nullptr);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 24;
    EXPECT_TRUE(engine.add_request(i, prompts[i], p).is_ok());
  }
  r.tokens.resize(prompts.size());
  std::vector<RequestOutput> outs;
  while (engine.has_work()) {
    const Status st = engine.step(outs);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
  }
  for (const RequestOutput& o : outs)
    r.tokens[o.request_id].insert(r.tokens[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  r.stats = engine.stats();
  r.graph_replays = rt.runner->stats().graph_replays;
  return r;
}

class CudaSpeculative : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSpeculative, GreedyTokensUnchangedAndGraphsEqualEager) {
  REQUIRE_GPU();
  const std::string dir = GetParam() == "demo" ? fixtures::source_dir() + "/models/moonrun-demo"
                                                : fixtures::fixtures_dir() + "/" + GetParam();
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.is_ok());
  const auto prompts = prompts_for(dir, cfg->vocab_size);
  for (int max_running : {1, 4}) {
    const SpecRun plain = run(dir, prompts, 0, max_running, true);
    const SpecRun graphs = run(dir, prompts, 4, max_running, true);
    const SpecRun eager = run(dir, prompts, 4, max_running, false);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(graphs.tokens[i], plain.tokens[i]) << GetParam() << ", prompt " << i << ", " << max_running << " at a time";
      EXPECT_EQ(graphs.tokens[i], eager.tokens[i]) << GetParam() << ", prompt " << i << " (graphs vs eager)";
    }
    // Drafts were verified and some rejected (rollbacks); whether a fixture's random weights
    // ever agree with a draft is theirs to say (k3-tiny-b and kimi-linear-tiny never do here:
    // the rollback test below covers every acceptance count on them).
    EXPECT_GT(graphs.stats.spec_draft_tokens_total, graphs.stats.spec_accepted_tokens_total);
    if (GetParam() == "demo" || GetParam() == "k3-tiny-a") EXPECT_GT(graphs.stats.spec_accepted_tokens_total, 0);
    if (max_running == 1) EXPECT_GT(graphs.graph_replays, 0);
    std::printf("%s, %d at a time: steps %lld (plain %lld), drafts %lld, accepted %lld, graph replays %lld\n",
                GetParam().c_str(), max_running, static_cast<long long>(graphs.stats.steps_total),
                static_cast<long long>(plain.stats.steps_total),
                static_cast<long long>(graphs.stats.spec_draft_tokens_total),
                static_cast<long long>(graphs.stats.spec_accepted_tokens_total),
                static_cast<long long>(graphs.graph_replays));
  }
}

// The trained DSpark draft of the demo model on the GPU: its blocks run on the CUDA ops beside
// the target's graphs (and in graphs of their own); the greedy tokens stay the target's own.
TEST(CudaDSpark, GreedyTokensUnchangedWithTheTrainedDemoDraft) {
  REQUIRE_GPU();
  const std::string dir = fixtures::source_dir() + "/models/moonrun-demo";
  const std::string draft = fixtures::source_dir() + "/models/moonrun-demo-dspark";
  if (!std::filesystem::exists(draft + "/config.json")) GTEST_SKIP() << "no trained demo draft";
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.is_ok());
  const auto prompts = prompts_for(dir, cfg->vocab_size);
  for (int max_running : {1, 4}) {
    const SpecRun plain = run(dir, prompts, 0, max_running, true);
    const SpecRun spec = run(dir, prompts, 7, max_running, true, draft);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "prompt " << i << ", " << max_running << " at a time";
    EXPECT_GT(spec.stats.spec_accepted_tokens_total, 0);
    // The draft's passes captured in graphs (padded to a power of two sequences) propose
    // what its eager passes do: the same kernels on the same rows.
    const SpecRun eager = run(dir, prompts, 7, max_running, false, draft);
    EXPECT_EQ(spec.stats.spec_draft_tokens_total, eager.stats.spec_draft_tokens_total) << max_running << " at a time";
    EXPECT_EQ(spec.stats.spec_accepted_per_position, eager.stats.spec_accepted_per_position)
        << max_running << " at a time";
    std::printf("dspark, %d at a time: steps %lld (plain %lld), drafts %lld, accepted %lld, graph replays %lld\n",
                max_running, static_cast<long long>(spec.stats.steps_total),
                static_cast<long long>(plain.stats.steps_total),
                static_cast<long long>(spec.stats.spec_draft_tokens_total),
                static_cast<long long>(spec.stats.spec_accepted_tokens_total),
                static_cast<long long>(spec.graph_replays));
  }
}

TEST_P(CudaSpeculative, RollbackLeavesTheStateOfAStepOverTheAcceptedTokens) {
  REQUIRE_GPU();
  if (GetParam() == "demo") GTEST_SKIP() << "the fixtures cover it";
  const std::string dir = fixtures::fixtures_dir() + "/" + GetParam();
  const int k = 5;
  RuntimeOptions ro = testing::test_runtime_options("cuda", 1024, 2);
  ro.mem_fraction_static = 0.2;
  ro.dtype = "float32";
  ro.cuda_graphs = false;
  ro.num_speculative_tokens = k;
  Runtime rt = testing::make_runtime(dir, ro);
  auto* runner = dynamic_cast<ModelRunner*>(rt.runner.get());
  ASSERT_TRUE(runner);
  if (runner->pools().state.empty()) GTEST_SKIP() << "no recurrent state";
  const int vocab = rt.config.vocab_size, verify_slot = rt.cache.total_slots();
  std::vector<int32_t> pages;
  for (int p = 0; p < rt.cache.num_pages / 2; ++p) pages.push_back(p);
  std::vector<int32_t> other_pages = {rt.cache.num_pages - 1};
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back((i * 37 + 11) % vocab);
  const int n = static_cast<int>(prompt.size());
  std::vector<int32_t> verify = {5};
  for (int j = 0; j < k; ++j) verify.push_back((j * 101 + 7) % vocab);
  const int32_t other = 3;
  auto seq = [&](std::span<const int32_t> t, int n_past, int slot) {
    StepSeq s;
    s.new_token_ids = t;
    s.n_past = n_past;
    s.state_slot = slot;
    s.pages = slot == 0 ? std::span<const int32_t>(pages) : std::span<const int32_t>(other_pages);
    return s;
  };
  auto step = [&](StepInput in) {
    StepOutput out;
    const Status st = runner->step(in, out);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  };
  auto state = [&] {
    const Tensor row = runner->pools().state.rows_view(0, 1);
    std::vector<float> v(row.cols);
    runner->ops().download(row, v.data());
    return v;
  };
  for (int accepted = 0; accepted <= k; ++accepted) {
    StepInput pre;
    pre.seqs.push_back(seq(prompt, 0, 0));
    pre.before.push_back({-1, 0});
    step(pre);
    StepInput ver;
    ver.seqs.push_back(seq(verify, n, 0));
    ver.seqs.back().n_draft = k;
    ver.before.push_back({0, verify_slot});
    step(ver);
    StepInput next;
    next.replays.push_back({0, verify_slot, 0, 1 + accepted});
    next.seqs.push_back(seq(std::span<const int32_t>(&other, 1), 0, 1));
    next.before.push_back({-1, 1});
    step(next);
    const std::vector<float> got = state();
    step(pre);
    StepInput alone;
    alone.seqs.push_back(seq(std::span<const int32_t>(verify).first(1 + accepted), n, 0));
    step(alone);
    const std::vector<float> want = state();
    double worst = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
      scale = std::max(scale, std::fabs(double(want[i])));
    }
    std::printf("OPERR spec/%s rollback-%d-of-%d %.3e %.1e %s\n", GetParam().c_str(), accepted, k, worst, 1e-4 * scale,
                worst <= 1e-4 * scale ? "ok" : "FAIL");
    EXPECT_LE(worst, 1e-4 * scale) << "accepted " << accepted;
  }
}

std::vector<std::string> params() {
  std::vector<std::string> p = fixtures::cuda_fixture_names();
  p.push_back("demo");
  return p;
}

INSTANTIATE_TEST_SUITE_P(Models, CudaSpeculative, ::testing::ValuesIn(params()), [](const auto& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
});

}  // namespace
}  // namespace moonrun
