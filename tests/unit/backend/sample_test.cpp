// The CPU sampler (the reference of Ops::sample) against distributions derived by hand from
// vLLM's definitions, with its rows made the way the engine and `generate` make them
// (runtime/sequence_sampler.h: params, seed, prompt, the tokens sampled so far).
#include "backend/cpu/sample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "runtime/sequence_sampler.h"

namespace moonrun {
namespace {

using namespace moonrun::cpu;

// A sequence's next sampling row after `output` was sampled from `prompt`.
SamplingBatch batch_for(const SamplingParams& p, std::span<const int32_t> prompt, std::span<const int32_t> output,
                        uint64_t seed = 0) {
  SequenceSampler s(p, seed, prompt);
  for (int32_t t : output) s.accept(t);
  SamplingBatch b;
  s.add_row(b, static_cast<int>(output.size()), {});
  return b;
}

// One draw per call from a seeded stream, as a sequence samples token after token.
class Draws {
 public:
  Draws(const SamplingParams& p, uint64_t seed, std::vector<int32_t> prompt = {})
      : prompt_(std::move(prompt)), sampler_(p, seed, prompt_) {}
  SampleResult next(const std::vector<float>& logits) {
    SamplingBatch b;
    sampler_.add_row(b, n_++, {});
    SampleResult r = sample_row(logits.data(), static_cast<int>(logits.size()), b.rows[0], b);
    sampler_.accept(r.token);
    return r;
  }

 private:
  std::vector<int32_t> prompt_;
  SequenceSampler sampler_;
  int n_ = 0;
};

// logits = ln(p) for p = [0.1, 0.2, 0.3, 0.4]: softmax gives p back.
std::vector<float> known_logits() {
  return {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
}

SamplingParams random_params() {
  SamplingParams p;
  p.temperature = 1.0f;
  return p;
}

void expect_dist(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
}

std::vector<double> dist(const SamplingParams& p, std::vector<int32_t> prompt = {}, std::vector<int32_t> output = {}) {
  const auto l = known_logits();
  const SamplingBatch b = batch_for(p, prompt, output);
  return sampling_distribution(l.data(), 4, b.rows[0], b);
}

TEST(Sampler, TemperatureScalesLogits) {
  SamplingParams p = random_params();
  expect_dist(dist(p), {0.1, 0.2, 0.3, 0.4});
  p.temperature = 0.5f;  // p^2 normalised: [1, 4, 9, 16] / 30
  expect_dist(dist(p), {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0});
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  SamplingParams p = random_params();
  p.top_p = 0.65f;  // 0.4 + 0.3 = 0.7 >= 0.65: keep {3, 2}
  expect_dist(dist(p), {0, 0, 3 / 7.0, 4 / 7.0});
  p.top_p = 0.35f;  // 0.4 alone reaches 0.35
  expect_dist(dist(p), {0, 0, 0, 1});
  p.top_p = 0.85f;  // 0.4 + 0.3 + 0.2 = 0.9
  expect_dist(dist(p), {0, 2 / 9.0, 3 / 9.0, 4 / 9.0});
}

TEST(Sampler, TopKKeepsTheKLargestAndTiesAtTheBoundary) {
  SamplingParams p = random_params();
  p.top_k = 2;
  expect_dist(dist(p), {0, 0, 3 / 7.0, 4 / 7.0});
  p.top_k = -1;
  expect_dist(dist(p), {0.1, 0.2, 0.3, 0.4});
  std::vector<float> tied = {1.0f, 2.0f, 2.0f, 3.0f};
  std::vector<float> l = tied;
  apply_top_k_top_p(l, 2, 1.0f);
  EXPECT_TRUE(std::isinf(l[0]));
  EXPECT_EQ(l[1], 2.0f);  // both 2.0 stay: >= the 2nd largest
  EXPECT_EQ(l[2], 2.0f);
}

// vLLM's top-p literally (sort ascending, drop while the cumulative mass <= 1 - p, keep the
// last), against the partial-sort implementation on a large random vocabulary.
TEST(Sampler, TopPMatchesTheAscendingDefinitionOnALargeVocabulary) {
  SamplerRng rng(5);
  const int vocab = 20000;
  std::vector<float> logits(vocab);
  for (auto& x : logits) x = static_cast<float>(8.0 * rng.uniform() * rng.uniform());
  for (float top_p : {0.05f, 0.3f, 0.9f, 0.999f}) {
    const std::vector<double> p = softmax(logits);
    std::vector<int32_t> asc(vocab);
    for (int i = 0; i < vocab; ++i) asc[i] = i;
    std::sort(asc.begin(), asc.end(), [&](int32_t a, int32_t b) { return p[a] < p[b] || (p[a] == p[b] && a > b); });
    std::vector<bool> keep(vocab, true);
    double cumulative = 0.0;
    for (int i = 0; i + 1 < vocab; ++i) {
      cumulative += p[asc[i]];
      if (cumulative <= 1.0 - top_p) keep[asc[i]] = false;
    }
    std::vector<float> got = logits;
    apply_top_k_top_p(got, 0, top_p);
    int n_kept = 0, n_mismatch = 0;
    for (int i = 0; i < vocab; ++i) {
      n_kept += keep[i];
      n_mismatch += keep[i] == std::isinf(got[i]);
    }
    // Summation order differs (ascending vs from the top): at most the boundary token may
    // flip, when its cumulative mass sits within rounding of 1 - top_p.
    EXPECT_LE(n_mismatch, 1) << "top_p " << top_p << ", " << n_kept << " kept";
    EXPECT_GT(n_kept, 0);
  }
}

TEST(Sampler, TopKThenTopPOnTheRenormalisedRest) {
  SamplingParams p = random_params();
  p.top_k = 3;     // {1, 2, 3}: [2, 3, 4] / 9
  p.top_p = 0.5f;  // 4/9 = 0.44 < 0.5, + 3/9 = 0.78: keep {2, 3}
  expect_dist(dist(p), {0, 0, 3 / 7.0, 4 / 7.0});
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheTop) {
  SamplingParams p = random_params();
  p.min_p = 0.6f;  // threshold 0.24: keep 0.3, 0.4
  expect_dist(dist(p), {0, 0, 3 / 7.0, 4 / 7.0});
  p.min_p = 0.45f;  // threshold 0.18: keep 0.2, 0.3, 0.4
  expect_dist(dist(p), {0, 2 / 9.0, 3 / 9.0, 4 / 9.0});
}

TEST(Sampler, MinPComesAfterTemperature) {
  // With T = 0.5 the distribution is [1, 4, 9, 16] / 30; min_p 0.3 -> threshold 0.16:
  // keeps 9/30 = 0.3 and 16/30 (at T = 1 it would also keep 0.2 >= 0.12).
  SamplingParams p = random_params();
  p.temperature = 0.5f;
  p.min_p = 0.3f;
  expect_dist(dist(p), {0, 0, 9 / 25.0, 16 / 25.0});
}

TEST(Sampler, PenaltiesFollowOpenAiAndHfDefinitions) {
  // Repetition over prompt + output (divide positive logits, multiply negative ones);
  // frequency by count and presence once, over the output only.
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 1.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  const std::vector<int32_t> prompt = {1};
  const std::vector<int32_t> output = {2, 2, 3};
  const SamplingBatch b = batch_for(p, prompt, output);
  apply_penalties(l, b.rows[0], b.history);
  EXPECT_FLOAT_EQ(l[0], 2.0f);                        // unseen
  EXPECT_FLOAT_EQ(l[1], -2.0f);                       // prompt only: repetition
  EXPECT_FLOAT_EQ(l[2], 0.5f / 2 - 2 * 0.5f - 0.25f); // twice in the output
  EXPECT_FLOAT_EQ(l[3], 1.0f / 2 - 1 * 0.5f - 0.25f); // once
}

TEST(Sampler, GreedyIsTheArgmaxOfThePenalisedLogits) {
  std::vector<float> l = {1.0f, 3.0f, 2.5f, 3.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  SamplingBatch b = batch_for(p, {}, {});
  EXPECT_EQ(sample_row(l.data(), 4, b.rows[0], b).token, 1);  // first of the tied maxima
  p.presence_penalty = 1.0f;
  const std::vector<int32_t> out = {1, 3};
  b = batch_for(p, {}, out);
  EXPECT_EQ(sample_row(l.data(), 4, b.rows[0], b).token, 2);  // 3 - 1 < 2.5
}

TEST(Sampler, SeededDrawsAreDeterministicAndFollowTheDistribution) {
  const auto l = known_logits();
  SamplingParams p = random_params();
  Draws a(p, 42), b(p, 42), c(p, 43);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 64; ++i) {
    sa.push_back(a.next(l).token);
    sb.push_back(b.next(l).token);
    sc.push_back(c.next(l).token);
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  // 40000 draws: each frequency within 5 standard deviations of p.
  Draws r(p, 7);
  std::vector<int> counts(4, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[r.next(l).token];
  const double want[4] = {0.1, 0.2, 0.3, 0.4};
  for (int t = 0; t < 4; ++t) {
    const double sd = std::sqrt(want[t] * (1 - want[t]) / n);
    EXPECT_NEAR(counts[t] / static_cast<double>(n), want[t], 5 * sd) << "token " << t;
  }
  // A token outside top-k is never drawn.
  p.top_k = 2;
  Draws k(p, 8);
  for (int i = 0; i < 2000; ++i) EXPECT_GE(k.next(l).token, 2);
}

TEST(Sampler, LogprobsAreRawLogSoftmaxWithTheTopKBestFirst) {
  const auto l = known_logits();
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 100.0f;  // processing does not touch the reported logprobs
  p.logprobs = 2;
  const std::vector<int32_t> prompt = {3};
  SamplingBatch b = batch_for(p, prompt, {});
  SampleResult r = sample_row(l.data(), 4, b.rows[0], b);
  EXPECT_EQ(r.token, 2);  // 3 penalised: ln 0.4 * 100
  EXPECT_NEAR(r.logprob, std::log(0.3), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 3);
  EXPECT_NEAR(r.top[0].logprob, std::log(0.4), 1e-6);
  EXPECT_EQ(r.top[1].token, 2);
  p.logprobs = -1;
  b = batch_for(p, prompt, {});
  EXPECT_TRUE(sample_row(l.data(), 4, b.rows[0], b).top.empty());
}

// logit_bias is added to the raw logits; min_tokens bans EOS and stop tokens until enough
// came; the structured-output mask leaves only the allowed ids.
TEST(Sampler, LogitBiasMinTokensAndTheAllowedMask) {
  const auto l = known_logits();  // argmax 3
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{0, 5.0f}};  // ln 0.1 + 5 > ln 0.4
  SamplingBatch b = batch_for(p, {}, {});
  EXPECT_EQ(sample_row(l.data(), 4, b.rows[0], b).token, 0);
  p.logit_bias.clear();
  p.min_tokens = 2;
  SequenceSampler s(p, 0, {});
  const int32_t eos[] = {3};
  for (int n_out : {0, 1, 2}) {
    SamplingBatch bb;
    s.add_row(bb, n_out, eos);
    EXPECT_EQ(sample_row(l.data(), 4, bb.rows[0], bb).token, n_out < 2 ? 2 : 3) << n_out;
  }
  const uint32_t only_token_1 = 1u << 1;
  SamplingBatch bm;
  SequenceSampler(SamplingParams{.temperature = 0.0f}, 0, {}).add_row(bm, 0, {}, std::span(&only_token_1, 1));
  EXPECT_EQ(sample_row(l.data(), 4, bm.rows[0], bm).token, 1);
}

TEST(SamplingParams, ValidateNamesTheField) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_NE(p.validate().message().find("top_p"), std::string::npos);
  p = {};
  p.max_tokens = 0;
  EXPECT_NE(p.validate().message().find("max_tokens"), std::string::npos);
  p = {};
  p.temperature = -1;
  EXPECT_EQ(p.validate().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(SamplingParams{}.validate().is_ok());
}

}  // namespace
}  // namespace moonrun
