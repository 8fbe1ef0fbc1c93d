// A request's sampling row as the engine makes it (Engine::add_sampling_row, runtime/
// sequence_sampler.h), through the real CPU sampler of the fake model: logit_bias added to
// the raw logits, EOS and stop tokens banned until min_tokens, the constraint's mask
// applied and accept() told every sampled token, one constraint per sequence for n > 1.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "engine/engine.h"
#include "fake_runner.h"
#include "test_pool.h"

namespace moonrun {
namespace {

constexpr int kVocab = 48;
constexpr int32_t kEos = 0;

// Allows exactly one token per step: script[step]; after the script, nothing (finished).
class ScriptConstraint final : public TokenConstraint {
 public:
  ScriptConstraint(std::vector<int32_t> script, std::vector<int32_t>* accepted) : script_(std::move(script)), accepted_(accepted) {}
  void fill_allowed(std::span<uint32_t> bits) override {
    ++fills;
    if (step_ < script_.size()) bits[script_[step_] / 32] |= 1u << (script_[step_] % 32);
  }
  bool accept(int32_t token) override {
    accepted_->push_back(token);
    const bool ok = step_ < script_.size() && token == script_[step_];
    ++step_;
    return ok;
  }
  bool finished() const override { return step_ >= script_.size(); }
  int fills = 0;

 private:
  std::vector<int32_t> script_;
  std::vector<int32_t>* accepted_;
  size_t step_ = 0;
};

// One request through the engine over the fake model; its tokens.
std::vector<int32_t> run_one(const SamplingParams& p, std::vector<int32_t> prompt = {1, 2, 3}) {
  CacheManager cache(testing::test_pool(64, 4, 4));
  testing::FakeRunner runner(64, 4, 4, kVocab);
  Engine engine(EngineConfig{SchedulerConfig{}, 64, {kEos}, 0}, cache, runner, nullptr);
  EXPECT_TRUE(engine.add_request(1, std::move(prompt), p).is_ok());
  std::vector<RequestOutput> outs;
  while (engine.has_work()) EXPECT_TRUE(engine.step(outs).is_ok());
  std::vector<int32_t> tokens;
  for (const auto& o : outs) tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  return tokens;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

// Greedy decoding straight from the fake model's definition, with `edit` applied to each
// step's logits (step = tokens generated so far): the reference for the rows' edits.
std::vector<int32_t> reference(std::vector<int32_t> tokens, int max_tokens,
                               const std::function<void(int step, std::vector<float>&)>& edit) {
  std::vector<int32_t> out;
  std::vector<float> logits(kVocab);
  while (static_cast<int>(out.size()) < max_tokens) {
    testing::fake_logits(testing::digest_of(tokens), kVocab, logits.data());
    edit(static_cast<int>(out.size()), logits);
    const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    tokens.push_back(best);
    if (best == kEos) break;
  }
  return out;
}

TEST(SamplingRows, LogitBiasIsAddedToTheRawLogits) {
  SamplingParams p = greedy(6);
  p.ignore_eos = true;
  p.logit_bias = {{17, 60.0f}, {23, -40.0f}, {31, 25.5f}};
  const auto want = reference({1, 2, 3}, 6, [](int, std::vector<float>& l) {
    l[17] += 60.0f;
    l[23] -= 40.0f;
    l[31] += 25.5f;
  });
  EXPECT_EQ(run_one(p), want);
  EXPECT_NE(want, reference({1, 2, 3}, 6, [](int, std::vector<float>&) {}));  // the bias mattered
}

TEST(SamplingRows, MinTokensBansEosAndStopTokensUntilReached) {
  SamplingParams p = greedy(10);
  p.logit_bias = {{kEos, 100.0f}, {7, 100.0f}};  // EOS and stop token 7 near the top
  p.stop_token_ids = {7};
  p.min_tokens = 2;
  const auto want = reference({1, 2, 3}, 10, [](int step, std::vector<float>& l) {
    l[kEos] += 100.0f;
    l[7] += 100.0f;
    if (step < 2) l[kEos] = l[7] = -std::numeric_limits<float>::infinity();
  });
  auto got = run_one(p);
  std::vector<int32_t> want_cut;
  for (int32_t t : want) {
    want_cut.push_back(t);
    if (t == 7) break;
  }
  EXPECT_EQ(got, want_cut);
  ASSERT_GE(got.size(), 3u);  // the bans held for two tokens
  EXPECT_TRUE(got[2] == kEos || got[2] == 7);
}

TEST(SamplingRows, ConstraintMaskThenEosWhenItIsDone) {
  std::vector<int32_t> accepted;
  SamplingParams p = greedy(10);
  p.temperature = 1.0f;
  p.seed = 3;
  p.make_constraint = [&] {
    return std::unique_ptr<TokenConstraint>(new ScriptConstraint(std::vector<int32_t>{33, 5}, &accepted));
  };
  EXPECT_EQ(run_one(p), (std::vector<int32_t>{33, 5, kEos}));
  EXPECT_EQ(accepted, (std::vector<int32_t>{33, 5, kEos}));
}

TEST(EngineConstraint, EverySequenceFollowsItsOwnConstraint) {
  CacheManager cache(testing::test_pool(64, 4, 4));
  testing::FakeRunner runner(64, 4, 4, kVocab);
  Engine engine(EngineConfig{SchedulerConfig{}, 64, {kEos}, 0}, cache, runner, nullptr);
  std::vector<std::vector<int32_t>> accepted(3);
  int made = 0;
  SamplingParams p;
  p.temperature = 1.0f;
  p.n = 3;
  p.max_tokens = 20;
  p.seed = 5;
  p.make_constraint = [&] {
    const int i = made++;
    std::vector<int32_t> script = {10 + i, 20 + i, 30 + i};
    return std::unique_ptr<TokenConstraint>(new ScriptConstraint(script, &accepted[i]));
  };
  ASSERT_TRUE(engine.add_request(1, {1, 2, 3}, p).is_ok());
  EXPECT_EQ(made, 3);
  std::map<int, std::vector<int32_t>> tokens;
  std::vector<RequestOutput> outs;
  while (engine.has_work()) ASSERT_TRUE(engine.step(outs).is_ok());
  for (const auto& o : outs) tokens[o.index].insert(tokens[o.index].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  // The sequences share nothing: each got its own factory call, in index order.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(tokens[i], (std::vector<int32_t>{10 + i, 20 + i, 30 + i, kEos})) << i;
    EXPECT_EQ(accepted[i], tokens[i]) << i;  // accept() saw every sampled token
  }
}

}  // namespace
}  // namespace moonrun
