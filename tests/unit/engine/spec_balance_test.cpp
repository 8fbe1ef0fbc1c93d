// SpecBalance (engine/spec_balance.h) against the step costs measured on an H100 with the
// demo model (bench-model --draft-tokens, docs/performance.md, 2026-12-05): decode steps of
// 0.654 ms at batch 1 and 0.964 ms at batch 32, verify steps at k = 4 of 1.084 and 2.169 ms;
// n-gram drafts yielding 1.93 tokens a verify step (bench/spec_decode_serve.py, same run).
// Alone speculation wins (1.78 vs 1.53 tokens/ms), over 32 streams it loses (28.5 vs 33.2):
// the balance must speculate in the first case and stand aside in the second, and come
// within a few percent of the better choice's throughput in both, while still trying the
// other choice now and then.
#include <gtest/gtest.h>

#include "engine/spec_balance.h"

namespace moonrun {
namespace {

struct Costs {
  int batch;
  double decode_ms, verify_ms, tokens_per_verify;
};

// Runs n steps; returns (fraction speculated, tokens per ms achieved).
std::pair<double, double> simulate(SpecBalance& b, const Costs& c, int n) {
  int spec = 0;
  double tokens = 0, ms = 0, carry = 0;  // a step yields whole tokens: the fractions carry over
  for (int i = 0; i < n; ++i) {
    const bool s = b.speculate(c.batch);
    const double t = s ? c.batch * c.tokens_per_verify : c.batch;
    const double m = s ? c.verify_ms : c.decode_ms;
    carry += t;
    const auto whole = static_cast<int64_t>(carry);
    carry -= static_cast<double>(whole);
    b.record(c.batch, s, whole, m / 1e3);
    spec += s;
    tokens += t;
    ms += m;
  }
  return {static_cast<double>(spec) / n, tokens / ms};
}

TEST(SpecBalance, SpeculatesAloneAndStandsAsideOverThirtyTwoStreams) {
  SpecBalance b;
  const Costs alone{1, 0.654, 1.084, 1.93}, many{32, 0.964, 2.169, 1.93};
  const auto [spec1, rate1] = simulate(b, alone, 2000);
  const auto [spec32, rate32] = simulate(b, many, 2000);
  EXPECT_GT(spec1, 0.9);
  EXPECT_LT(spec32, 0.1);
  const double best1 = alone.tokens_per_verify / alone.verify_ms, best32 = many.batch / many.decode_ms;
  EXPECT_GT(rate1, 0.97 * best1) << rate1 << " of " << best1;
  EXPECT_GT(rate32, 0.95 * best32) << rate32 << " of " << best32;
  // Each batch size learned its own verdict; both kinds were measured in both.
  EXPECT_GT(b.rate(1, true), b.rate(1, false));
  EXPECT_LT(b.rate(32, true), b.rate(32, false));
}

TEST(SpecBalance, FollowsAWorkloadThatChanges) {
  // Drafts stop being accepted (a new kind of prompt): the balance stands aside within a few
  // exploration rounds; they come back: it speculates again.
  SpecBalance b;
  simulate(b, {1, 0.654, 1.084, 3.0}, 500);
  const auto [spec_bad, rate_bad] = simulate(b, {1, 0.654, 1.084, 1.0}, 2000);
  EXPECT_LT(spec_bad, 0.15);
  // Relearning runs on the exploration steps (one in 32): a thousand steps, then it holds.
  simulate(b, {1, 0.654, 1.084, 3.0}, 1000);
  const auto [spec_good, rate_good] = simulate(b, {1, 0.654, 1.084, 3.0}, 1000);
  EXPECT_GT(spec_good, 0.9);
}

}  // namespace
}  // namespace moonrun
