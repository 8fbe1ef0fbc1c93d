// The per-request logits hook (logits_processing.h) and its place in Engine::sample:
// logit_bias added to the raw logits, EOS and stop tokens masked until min_tokens, the
// constraint's bitmask applied and accept() told every sampled token, one constraint per
// sequence for n > 1.
#include "engine/logits_processing.h"

#include <gtest/gtest.h>

#include <cmath>
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

Request make_request(SamplingParams p) {
  Request r;
  r.params = std::move(p);
  return r;
}

TEST(LogitsProcessing, BiasIsAddedToTheRawLogits) {
  SamplingParams p;
  p.logit_bias = {{3, 2.5f}, {5, -100.0f}, {999, 1.0f}};  // out of the vocabulary: ignored
  Request r = make_request(p);
  std::vector<float> row(kVocab, 1.0f);
  std::vector<uint32_t> scratch;
  process_request_logits(r, row, std::vector<int32_t>{kEos}, scratch);
  EXPECT_FLOAT_EQ(row[3], 3.5f);
  EXPECT_FLOAT_EQ(row[5], -99.0f);
  EXPECT_FLOAT_EQ(row[4], 1.0f);
}

TEST(LogitsProcessing, MinTokensMasksEosAndStopTokensUntilReached) {
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {7};
  Request r = make_request(p);
  std::vector<uint32_t> scratch;
  for (int generated = 0; generated <= 3; ++generated) {
    r.output_ids.assign(generated, 9);
    std::vector<float> row(kVocab, 0.5f);
    process_request_logits(r, row, std::vector<int32_t>{kEos}, scratch);
    const bool masked = generated < 2;
    EXPECT_EQ(std::isinf(row[kEos]), masked) << generated;
    EXPECT_EQ(std::isinf(row[7]), masked) << generated;
    EXPECT_FALSE(std::isinf(row[8]));
  }
}

TEST(LogitsProcessing, ConstraintMaskAndEmptyMaskFallsBackToEos) {
  std::vector<int32_t> accepted;
  Request r = make_request({});
  r.constraint = std::make_unique<ScriptConstraint>(std::vector<int32_t>{33}, &accepted);
  std::vector<float> row(kVocab, 1.0f);
  std::vector<uint32_t> scratch;
  process_request_logits(r, row, std::vector<int32_t>{kEos}, scratch);
  for (int t = 0; t < kVocab; ++t) EXPECT_EQ(std::isinf(row[t]), t != 33) << t;
  r.constraint->accept(33);
  std::vector<float> after(kVocab, 1.0f);
  process_request_logits(r, after, std::vector<int32_t>{kEos}, scratch);  // finished: only EOS
  for (int t = 0; t < kVocab; ++t) EXPECT_EQ(std::isinf(after[t]), t != kEos) << t;
}

TEST(EngineConstraint, EverySequenceFollowsItsOwnConstraint) {
  CacheManager cache(testing::test_pool(64, 4, 4));
  testing::FakeRunner runner(cache.mla_view(), 4, kVocab);
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
