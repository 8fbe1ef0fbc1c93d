// Speculative decoding (engine/draft_source.h, StepSeq::n_draft, StateReplay) on the CPU
// backend with real checkpoints: the reference fixtures (KDA + MLA, made by the public
// reference code) and the trained demo model.
//   - Lossless: greedy tokens with n-gram drafts are the tokens without them, for every
//     fixture's reference prompts and repetitive prompts that make drafts both accepted and
//     rejected, several requests at once so verify steps mix with decodes and prefill chunks.
//   - Rollback exact: a verify step that accepts j of k drafts (every j in 0..k), then its
//     rollback, leaves every KDA layer's conv windows and recurrent state bit for bit where a
//     step over the accepted tokens alone leaves them, and the next logits agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "../../support/fixture_files.h"
#include "../../support/runtimes.h"
#include "engine/draft_source.h"
#include "engine/engine.h"
#include "model/kimi_k3.h"
#include "runtime/model_runner.h"
#include "runtime/token_constraint.h"
#include "tools/bench_model.h"

namespace moonrun {
namespace {

using testing::make_runtime;
using testing::test_runtime_options;

struct Case {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
};

std::vector<Case> reference_cases(const std::string& dir) {
  std::ifstream in(dir + "/expected.json");
  const auto j = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& c : j.at("cases")) cases.push_back({c.at("prompt_ids").get<std::vector<int32_t>>(), 24});
  return cases;
}

int vocab_of(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  const auto j = nlohmann::json::parse(in);
  return j.contains("text_config") ? j["text_config"].at("vocab_size").get<int>() : j.at("vocab_size").get<int>();
}

// Prompts that repeat a pattern: the n-gram lookup proposes its continuation, which the
// model may or may not follow (drafts accepted and rejected).
std::vector<Case> repetitive_cases(int vocab, int n) {
  std::vector<Case> cases;
  uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  };
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> pattern;
    for (int t = 0; t < 3 + i % 9; ++t) pattern.push_back(next());
    Case c;
    for (int r = 0; r < 2 + i % 4; ++r) c.prompt.insert(c.prompt.end(), pattern.begin(), pattern.end());
    c.prompt.push_back(pattern[0]);
    c.max_tokens = 20 + i % 7;
    cases.push_back(c);
  }
  return cases;
}

struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
  int64_t cached_prompt_tokens = 0;  // served from the prefix cache, all requests
};

// pool_tokens: the KV pool (small: preemptions); prefix_cache: the runtime's prefix cache.
EngineRun run_engine(const std::string& dir, const std::vector<Case>& cases, const SpeculativeConfig& spec,
                     int max_running, int chunk, int64_t pool_tokens = 4096, bool prefix_cache = false,
                     std::function<std::unique_ptr<TokenConstraint>()> make_constraint = nullptr,
                     bool pad_drafts = false, int tp_size = 1, int pp_size = 1) {
  EngineRun run;
  RuntimeOptions ro = test_runtime_options("cpu", pool_tokens, max_running);
  ro.tp_size = tp_size;
  ro.ep_size = tp_size;
  ro.pp_size = pp_size;
  ro.prefix_cache = prefix_cache;
  ro.prefix_block_tokens = 64;  // snapshots every 64 tokens: the short test prompts hit the cache
  ro.prefix_snapshot_slots = 32;
  ro.num_speculative_tokens = spec.enabled() ? spec.num_speculative_tokens : 0;
  Runtime rt = make_runtime(dir, ro);
  if (!rt.runner) return run;
  CacheManager cache(rt.cache);
  EngineConfig ec;
  ec.scheduler = {.max_running_requests = max_running, .max_tokens_per_step = chunk};
  ec.max_model_len = static_cast<int>(std::min<int64_t>(1024, pool_tokens));
  ec.speculative = spec;  // no EOS: every request runs to max_tokens
  ec.pad_drafts = pad_drafts;
  Engine engine(ec, cache, *rt.runner, nullptr);
  for (size_t i = 0; i < cases.size(); ++i) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = cases[i].max_tokens;
    p.make_constraint = make_constraint;
    EXPECT_TRUE(engine.add_request(i, cases[i].prompt, p).is_ok());
  }
  run.tokens.resize(cases.size());
  std::vector<RequestOutput> outs;
  while (engine.has_work()) {
    const Status st = engine.step(outs);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
  }
  for (const RequestOutput& o : outs) {
    run.tokens[o.request_id].insert(run.tokens[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    if (o.finished) run.cached_prompt_tokens += o.num_cached_tokens;
  }
  run.stats = engine.stats();
  EXPECT_EQ(engine.stats().cache.free_slots, max_running);
  return run;
}

std::vector<std::string> model_dirs() {
  std::vector<std::string> dirs;
  for (const std::string& name : fixtures::fixture_names()) dirs.push_back(fixtures::fixtures_dir() + "/" + name);
  dirs.push_back(fixtures::source_dir() + "/models/moonrun-demo");
  return dirs;
}

// Every draft source: n-gram lookup (drafts at nearly every step) and suffix decoding (the
// request's own tokens and the answers of the requests beside and before it).
TEST(Speculative, DraftsChangeNoGreedyTokenOnAnyReferenceModel) {
  for (SpecMethod method : {SpecMethod::kNgram, SpecMethod::kSuffix}) {
    int64_t drafts = 0, accepted = 0;
    for (const std::string& dir : model_dirs()) {
      std::vector<Case> cases = reference_cases(dir);
      const std::vector<Case> more = repetitive_cases(vocab_of(dir), 12);
      cases.insert(cases.end(), more.begin(), more.end());
      const EngineRun plain = run_engine(dir, cases, {}, 4, 64);
      for (int k : {1, 4}) {
        SpeculativeConfig spec;
        spec.method = method;
        spec.num_speculative_tokens = k;
        spec.prompt_lookup_min = 1;  // drafts at nearly every step: many verdicts
        spec.prompt_lookup_max = 4;
        // k = 4 with the drafts padded to uniform verify steps (as on a GPU with graphs).
        const EngineRun fast = run_engine(dir, cases, spec, 4, 64, 4096, false, nullptr, k == 4);
        ASSERT_EQ(fast.tokens.size(), plain.tokens.size());
        for (size_t i = 0; i < cases.size(); ++i)
          EXPECT_EQ(fast.tokens[i], plain.tokens[i])
              << dir << ", " << spec_method_name(method) << ", prompt " << i << ", k = " << k;
        EXPECT_GT(fast.stats.spec_num_drafts_total, 0) << dir;
        EXPECT_LT(fast.stats.steps_total, plain.stats.steps_total + 1) << dir;
        drafts += fast.stats.spec_draft_tokens_total;
        accepted += fast.stats.spec_accepted_tokens_total;
        std::printf("%s %s k=%d: %lld steps (plain %lld), drafts %lld, accepted %lld\n", dir.c_str(),
                    spec_method_name(method), k, static_cast<long long>(fast.stats.steps_total),
                    static_cast<long long>(plain.stats.steps_total),
                    static_cast<long long>(fast.stats.spec_draft_tokens_total),
                    static_cast<long long>(fast.stats.spec_accepted_tokens_total));
      }
    }
    // Both verdicts happened, many times: the comparison covered rollbacks and kept drafts.
    EXPECT_GT(accepted, 20) << spec_method_name(method);
    EXPECT_GT(drafts - accepted, 20) << spec_method_name(method);
  }
}

// The rollback where the cache moves under it: requests that share long prefixes (served
// from the prefix cache, whose KDA snapshots a verify step must not disturb) in a pool too
// small for all of them (preemptions: a sequence with a pending rollback or a verify slot is
// freed and recomputed), with both draft sources. Greedy tokens equal a plain run's.
TEST(Speculative, DraftsChangeNothingAcrossThePrefixCacheAndPreemptions) {
  for (const std::string& name : {"k3-tiny-a", "kimi-linear-tiny"}) {
    const std::string dir = fixtures::fixtures_dir() + "/" + name;
    std::vector<Case> cases;
    const std::vector<Case> rep = repetitive_cases(vocab_of(dir), 6);
    // Each prompt twice and a third time with another tail: later copies hit the prefix cache.
    for (int copy = 0; copy < 3; ++copy)
      for (const Case& c : rep) {
        Case d = c;
        while (d.prompt.size() < 150) d.prompt.insert(d.prompt.end(), c.prompt.begin(), c.prompt.end());
        if (copy == 2) d.prompt.push_back(1);
        d.max_tokens = 40;
        cases.push_back(d);
      }
    const EngineRun plain = run_engine(dir, cases, {}, 4, 64);
    for (SpecMethod method : {SpecMethod::kNgram, SpecMethod::kSuffix}) {
      SpeculativeConfig spec;
      spec.method = method;
      spec.num_speculative_tokens = 4;
      spec.prompt_lookup_min = 1;
      spec.prompt_lookup_max = 4;
      // A pool with room (prefix hits), then 4 sequences of up to ~200 tokens in 640 (preemptions).
      for (const int64_t pool : {4096, 640}) {
        const EngineRun fast = run_engine(dir, cases, spec, 4, 64, pool, true);
        for (size_t i = 0; i < cases.size(); ++i)
          EXPECT_EQ(fast.tokens[i], plain.tokens[i])
              << name << ", " << spec_method_name(method) << ", pool " << pool << ", prompt " << i;
        if (pool == 640) EXPECT_GT(fast.stats.preemptions_total, 0) << name;
        if (pool == 4096) EXPECT_GT(fast.cached_prompt_tokens, 0) << name;
        EXPECT_GT(fast.stats.spec_accepted_tokens_total, 0) << name;
        EXPECT_GT(fast.stats.spec_draft_tokens_total - fast.stats.spec_accepted_tokens_total, 10) << name;
        std::printf("%s %s pool %lld: %lld preemptions, %lld cached prompt tokens, %lld of %lld drafts accepted\n",
                    name.c_str(), spec_method_name(method), static_cast<long long>(pool),
                    static_cast<long long>(fast.stats.preemptions_total),
                    static_cast<long long>(fast.cached_prompt_tokens),
                    static_cast<long long>(fast.stats.spec_accepted_tokens_total),
                    static_cast<long long>(fast.stats.spec_draft_tokens_total));
      }
    }
  }
}

// Under pipeline stages (issue 41) each stage rolls back and replays its own layers' KDA
// state: drafts through PP 2 (x TP 2 / EP 2), with the prefix cache and preemptions, give
// the greedy tokens of a plain one-rank run.
TEST(Speculative, DraftsChangeNothingUnderPipelineStages) {
  const std::string dir = fixtures::fixtures_dir() + "/k3-tiny-a";  // KDA layers on both stages
  std::vector<Case> cases;
  for (int copy = 0; copy < 2; ++copy)
    for (const Case& c : repetitive_cases(vocab_of(dir), 4)) {
      Case d = c;
      while (d.prompt.size() < 150) d.prompt.insert(d.prompt.end(), c.prompt.begin(), c.prompt.end());
      d.max_tokens = 32;
      cases.push_back(d);
    }
  const EngineRun plain = run_engine(dir, cases, {}, 4, 64);
  SpeculativeConfig spec;
  spec.method = SpecMethod::kNgram;
  spec.num_speculative_tokens = 4;
  spec.prompt_lookup_min = 1;
  spec.prompt_lookup_max = 4;
  for (const int tp : {1, 2})
    for (const int64_t pool : {4096, 640}) {
      const EngineRun fast = run_engine(dir, cases, spec, 4, 64, pool, true, nullptr, true, tp, 2);
      ASSERT_EQ(fast.tokens.size(), plain.tokens.size());
      for (size_t i = 0; i < cases.size(); ++i)
        EXPECT_EQ(fast.tokens[i], plain.tokens[i]) << "tp " << tp << ", pp 2, pool " << pool << ", prompt " << i;
      EXPECT_GT(fast.stats.spec_accepted_tokens_total, 0);
      EXPECT_GT(fast.stats.spec_draft_tokens_total - fast.stats.spec_accepted_tokens_total, 10);
      if (pool == 640) EXPECT_GT(fast.stats.preemptions_total, 0);
    }
}

// Structured output with drafts: an automaton over token ids (a token of the prompts' own
// alphabet, never the one just taken: drafts of the repeated patterns are often allowed and
// sometimes cut), each draft row masked by a copy advanced over the drafts before it. Greedy
// tokens equal a plain run's under the same constraint, and they obey it.
class AlphabetNoRepeat final : public TokenConstraint {
 public:
  explicit AlphabetNoRepeat(std::shared_ptr<const std::vector<int32_t>> alphabet) : alphabet_(std::move(alphabet)) {}
  void fill_allowed(std::span<uint32_t> bits) override {
    for (int32_t t : *alphabet_)
      if (t != last_) bits[t / 32] |= 1u << (t % 32);
  }
  bool accept(int32_t token) override {
    const bool ok = token != last_ && std::find(alphabet_->begin(), alphabet_->end(), token) != alphabet_->end();
    last_ = token;
    return ok;
  }
  bool finished() const override { return false; }
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<AlphabetNoRepeat>(*this); }

 private:
  std::shared_ptr<const std::vector<int32_t>> alphabet_;
  int32_t last_ = -1;
};

TEST(Speculative, StructuredOutputMasksEveryDraftRow) {
  for (const std::string& name : {"k3-tiny-a", "kimi-linear-tiny"}) {
    const std::string dir = fixtures::fixtures_dir() + "/" + name;
    const std::vector<Case> cases = repetitive_cases(vocab_of(dir), 12);
    auto alphabet = std::make_shared<std::vector<int32_t>>();
    for (const Case& c : cases)
      for (int32_t t : c.prompt)
        if (std::find(alphabet->begin(), alphabet->end(), t) == alphabet->end()) alphabet->push_back(t);
    auto make = [alphabet] { return std::unique_ptr<TokenConstraint>(new AlphabetNoRepeat(alphabet)); };
    const EngineRun plain = run_engine(dir, cases, {}, 4, 64, 4096, false, make);
    for (SpecMethod method : {SpecMethod::kNgram, SpecMethod::kSuffix}) {
      SpeculativeConfig spec;
      spec.method = method;
      spec.num_speculative_tokens = 4;
      spec.prompt_lookup_min = 1;
      spec.prompt_lookup_max = 4;
      const EngineRun fast = run_engine(dir, cases, spec, 4, 64, 4096, false, make);
      for (size_t i = 0; i < cases.size(); ++i) {
        EXPECT_EQ(fast.tokens[i], plain.tokens[i]) << name << ", " << spec_method_name(method) << ", prompt " << i;
        AlphabetNoRepeat check(alphabet);
        for (int32_t t : fast.tokens[i]) EXPECT_TRUE(check.accept(t)) << name << ", prompt " << i << ": " << t;
      }
      EXPECT_GT(fast.stats.spec_accepted_tokens_total, 0) << name << ", " << spec_method_name(method);
      std::printf("%s %s: %lld of %lld drafts accepted under the constraint\n", name.c_str(), spec_method_name(method),
                  static_cast<long long>(fast.stats.spec_accepted_tokens_total),
                  static_cast<long long>(fast.stats.spec_draft_tokens_total));
    }
  }
}

// Sampled rows against n-gram drafts: a draft is one token for sure, so a row's own draw is
// rejection sampling already (accept with probability p(draft), else a draw from p without
// it). The joint distribution of three tokens over 800 seeds, with and without drafts,
// passes a two-sample chi-square test (p = 0.001), while drafts are accepted and rejected.
TEST(Speculative, SampledOutputKeepsTheModelsDistribution) {
  const std::string dir = fixtures::fixtures_dir() + "/k3-tiny-a";
  const int vocab = vocab_of(dir), n_requests = 800, n_tokens = 3;
  // Three tokens get +30 on their logits: the samples are nearly always one of them, and the
  // prompt, a random string of the three, holds every n-gram the lookup needs (a draft at
  // every step, accepted about a third of the time).
  const int32_t abc[3] = {7 % vocab, 101 % vocab, 230 % vocab};
  std::vector<int32_t> prompt;
  for (int t = 0; t < 40; ++t) prompt.push_back(abc[(t * 7 + t / 3) % 3]);
  auto run = [&](bool speculate) {
    RuntimeOptions ro = test_runtime_options("cpu", 8192, 16);
    ro.num_speculative_tokens = speculate ? 3 : 0;
    Runtime rt = make_runtime(dir, ro);
    CacheManager cache(rt.cache);
    EngineConfig ec;
    ec.scheduler = {.max_running_requests = 16, .max_tokens_per_step = 512};
    ec.max_model_len = 256;
    if (speculate) ec.speculative = {SpecMethod::kNgram, 3, 1, 4, 0};
    Engine engine(ec, cache, *rt.runner, nullptr);
    for (int i = 0; i < n_requests; ++i) {
      SamplingParams p;
      p.temperature = 1.0f;
      for (int32_t t : abc) p.logit_bias.emplace_back(t, 30.0f);
      p.max_tokens = n_tokens;
      p.seed = 1000 + i;
      EXPECT_TRUE(engine.add_request(i, prompt, p).is_ok());
    }
    std::vector<std::vector<int32_t>> out(n_requests);
    std::vector<RequestOutput> outs;
    while (engine.has_work()) EXPECT_TRUE(engine.step(outs).is_ok());
    for (const RequestOutput& o : outs) out[o.request_id].insert(out[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    std::map<std::vector<int32_t>, int> counts;
    for (const auto& seq : out) ++counts[seq];
    return std::make_pair(counts, engine.stats());
  };
  const auto [plain, plain_stats] = run(false);
  const auto [spec, spec_stats] = run(true);
  EXPECT_GT(spec_stats.spec_accepted_tokens_total, 20);
  EXPECT_GT(spec_stats.spec_draft_tokens_total - spec_stats.spec_accepted_tokens_total, n_requests / 4);
  // Two-sample chi-square over the cells either run saw (equal sample sizes), cells with
  // fewer than 10 expected together in one.
  std::map<std::vector<int32_t>, std::pair<int, int>> cells;
  for (const auto& [k, n] : plain) cells[k].first = n;
  for (const auto& [k, n] : spec) cells[k].second = n;
  double chi2 = 0;
  int df = -1, small_a = 0, small_b = 0;
  for (const auto& [k, ab] : cells) {
    if (ab.first + ab.second < 20) {
      small_a += ab.first;
      small_b += ab.second;
      continue;
    }
    chi2 += std::pow(ab.first - ab.second, 2.0) / (ab.first + ab.second);
    ++df;
  }
  if (small_a + small_b > 0) {
    chi2 += std::pow(small_a - small_b, 2.0) / (small_a + small_b);
    ++df;
  }
  ASSERT_GE(df, 3) << "too few outcomes to test";
  // The chi-square quantile at 0.999 by Wilson-Hilferty.
  const double z = 3.0902, h = 2.0 / (9.0 * df);
  const double critical = df * std::pow(1 - h + z * std::sqrt(h), 3.0);
  std::printf("chi2 = %.1f over %d degrees of freedom (critical %.1f); accepted %lld of %lld drafts\n", chi2, df, critical,
              static_cast<long long>(spec_stats.spec_accepted_tokens_total),
              static_cast<long long>(spec_stats.spec_draft_tokens_total));
  EXPECT_LT(chi2, critical);
}

// ---- the rollback, op by op --------------------------------------------------------------

struct RunnerHarness {
  Runtime rt;
  ModelRunner* runner = nullptr;
  std::vector<std::vector<int32_t>> pages;  // per slot: a page table long enough for anything here

  explicit RunnerHarness(const std::string& dir, int k) {
    RuntimeOptions ro = test_runtime_options("cpu", 1024, 2);
    ro.num_speculative_tokens = k;
    rt = make_runtime(dir, ro);
    runner = dynamic_cast<ModelRunner*>(rt.runner.get());
    // Slot s owns pages [s * n, (s + 1) * n): the two sequences never share a row.
    const int n = rt.cache.num_pages / 2;
    for (int s = 0; s < 2; ++s) {
      pages.emplace_back();
      for (int p = 0; p < n; ++p) pages.back().push_back(s * n + p);
    }
  }
  StepSeq seq(std::span<const int32_t> tokens, int n_past, int slot) const {
    StepSeq s;
    s.new_token_ids = tokens;
    s.n_past = n_past;
    s.state_slot = slot;
    s.pages = pages[slot];
    return s;
  }
  std::vector<float> state(int slot) const {
    const Tensor row = runner->pools().state.rows_view(slot, 1);
    return std::vector<float>(row.as<float>(), row.as<float>() + row.cols);
  }
  // A step over `tokens` of slot `slot` from n_past, with the logits of its last token.
  std::vector<float> step(StepInput in) {
    in.return_logits = true;
    StepOutput out;
    const Status st = runner->step(in, out);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return out.logits;
  }
};

TEST(Speculative, RollbackAtEveryDraftPositionLeavesTheStateOfARunWithoutTheRejectedTokens) {
  const int k = 5;
  for (const std::string& name : {"k3-tiny-a", "k3-tiny-b", "kimi-linear-tiny"}) {
    const std::string dir = fixtures::fixtures_dir() + "/" + name;
    RunnerHarness h(dir, k);
    ASSERT_TRUE(h.runner);
    // One kernel choice for every step: a reference step of 1 token would otherwise take the
    // decode path (the KDA recurrence token by token, MLA in absorbed order) where the verify
    // step of 1 + k tokens takes the chunked KDA form and plain MLA, and its first token's
    // outputs (the next layers' inputs) would be a rounding apart. The rollback itself is
    // exact whatever the choice: it reruns the verify step's own inputs.
    auto* model = dynamic_cast<KimiK3*>(&h.runner->model());
    ASSERT_TRUE(model);
    model->set_attention_modes(KdaMode::kChunked, MlaMode::kPlain);
    ASSERT_EQ(h.rt.cache.num_verify_slots, h.rt.cache.num_state_slots) << name;
    const int verify_slot = h.rt.cache.total_slots();  // live slot 0's
    const int vocab = vocab_of(dir);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 70; ++i) prompt.push_back((i * 37 + 11) % vocab);  // past one KDA chunk of 64
    const int n_prompt = static_cast<int>(prompt.size());
    std::vector<int32_t> verify = {5};  // the last known token, then k drafts
    for (int j = 0; j < k; ++j) verify.push_back((j * 101 + 7) % vocab);
    const int32_t other = 3;

    for (int accepted = 0; accepted <= k; ++accepted) {
      // A: prefill, a verify step of 1 + k tokens, then the rollback to 1 + accepted of them
      // (run at the start of the next step, here one for another slot's sequence).
      StepInput pre;
      pre.seqs.push_back(h.seq(prompt, 0, 0));
      pre.before.push_back({-1, 0});
      h.step(pre);
      StepInput ver;
      ver.seqs.push_back(h.seq(verify, n_prompt, 0));
      ver.seqs.back().n_draft = k;
      ver.before.push_back({0, verify_slot});
      h.step(ver);
      StepInput next;
      next.replays.push_back({0, verify_slot, 0, 1 + accepted});
      next.seqs.push_back(h.seq(std::span<const int32_t>(&other, 1), 0, 1));
      next.before.push_back({-1, 1});
      h.step(next);
      const std::vector<float> rolled_back = h.state(0);
      const int32_t after = 9;
      StepInput cont;
      cont.seqs.push_back(h.seq(std::span<const int32_t>(&after, 1), n_prompt + 1 + accepted, 0));
      const std::vector<float> logits_a = h.step(cont);

      // B: the same prompt, then a step over the accepted tokens alone.
      h.step(pre);
      StepInput alone;
      alone.seqs.push_back(h.seq(std::span<const int32_t>(verify).first(1 + accepted), n_prompt, 0));
      h.step(alone);
      const std::vector<float> want = h.state(0);
      const std::vector<float> logits_b = h.step(cont);

      ASSERT_EQ(rolled_back.size(), want.size());
      size_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) differ += std::memcmp(&rolled_back[i], &want[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << name << ": " << differ << " of " << want.size()
                            << " state floats differ after accepting " << accepted << " of " << k;
      ASSERT_EQ(logits_a.size(), logits_b.size());
      double worst = 0;
      for (size_t i = 0; i < logits_a.size(); ++i) worst = std::max(worst, std::fabs(double(logits_a[i]) - logits_b[i]));
      EXPECT_LE(worst, 1e-5) << name << ", accepted " << accepted;
    }
  }
}

// bench-model --draft-tokens runs verify steps with a rollback every step (on the GPU it
// times them against decode steps); here, that the path runs through the real runner.
TEST(Speculative, BenchModelTimesVerifyStepsWithRollbacks) {
  tools::ModelBenchConfig c;
  c.model = fixtures::fixtures_dir() + "/k3-tiny-a";
  c.runtime.device = "cpu";
  c.runtime.log = false;
  c.batches = {1, 3};
  c.context_tokens = 20;
  c.warmup_steps = 1;
  c.decode_steps = 3;
  c.profile = false;
  c.draft_tokens = {1, 4};
  auto report = tools::run_model_bench(c);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  ASSERT_EQ(report->verify.size(), 4u);
  for (const tools::DecodeFigure& f : report->verify) EXPECT_GT(f.step_ms, 0) << f.draft_tokens << " " << f.batch;
  EXPECT_NE(tools::format_model_bench(*report).find("speculative verify steps"), std::string::npos);
  c.draft_tokens = {16};
  EXPECT_FALSE(tools::run_model_bench(c).is_ok());
}

TEST(Speculative, NgramLookupProposesWhatFollowedTheLongestRecentMatch) {
  NgramDraftSource src(2, 4);
  std::vector<int32_t> drafts;
  // "1 2 3 4 5 ... 1 2 3": the 3-gram "1 2 3" matched, "4 5" follows.
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 9, 9, 1, 2, 3};
  src.propose({1, prompt, {}}, 3, drafts);
  EXPECT_EQ(drafts, (std::vector<int32_t>{4, 5, 9}));
  // The output continues the sequence; the most recent occurrence of the longest match wins.
  drafts.clear();
  const std::vector<int32_t> p2 = {7, 8, 1, 7, 8, 2}, o2 = {7, 8};
  src.propose({1, p2, o2}, 2, drafts);
  EXPECT_EQ(drafts, (std::vector<int32_t>{2, 7}));
  // Shorter than prompt_lookup_min: nothing.
  drafts.clear();
  const std::vector<int32_t> p3 = {1, 2, 3, 1};
  src.propose({1, p3, {}}, 3, drafts);
  EXPECT_TRUE(drafts.empty());
}

}  // namespace
}  // namespace moonrun
