#pragma once
// Fair chunking by time (--max-prefill-step-ms, issue 47): the attention budget that keeps a
// step carrying a prefill chunk under a target time, learned from the engine's own steps.
//
// The scheduler cuts chunks to a budget of query-key pairs (scheduler.h, "fair chunking");
// what a pair costs depends on the model and the device. A step's time is close to
//   t = t0 + a * tokens + c * pairs
// (t0 the step's fixed part: launches, the weights every step reads; a the per-token work
// of every layer; c a query-key pair's, which dominates late in a long prompt). The pacer
// fits the three by least squares over recent steps (sums decayed by kDecay a step, a small
// ridge so that the early, collinear steps stay solvable); the engine hands the scheduler
// target - t0 as the step's budget at a and c (Scheduler::PrefillBudget), and the scheduler
// cuts each chunk to what fits beside the decodes. Until a pair's cost has been seen (a few
// prefill steps with attention), there is no bound.
//
// A target at or below the fixed part cannot be met by cutting chunks: every step re-reads
// the weights the prompt's tokens route to (~13 ms on an H100 for the K3-width slice) and
// runs the streams' decodes. The prompt then gets as much of a step as its fixed part
// (budget(): max(target - t0, t0)), so a step takes at most about twice its fixed part and
// the prompt's time to first token at most about twice its unpaced one, where a budget of
// zero (32-token chunks, each re-reading the weights) made a 1M-token prompt take over
// seven minutes beside 8 streams on an H100 (2026-12-07).
#include <array>
#include <cstdint>

#include "engine/scheduler.h"

namespace moonrun {

class PrefillPacer {
 public:
  static constexpr double kDecay = 0.98;
  static constexpr int kMinObservations = 4;  // prefill steps with pairs before any bound

  // A step ran: `tokens` tokens in all, its prefill chunks `pairs` query-key pairs.
  void record(int64_t tokens, int64_t pairs, double seconds);
  // The fitted t0 (seconds), a (seconds a token), c (seconds a pair); zeros until solvable.
  std::array<double, 3> fit() const;
  // Enough prefill steps seen, and a pair's cost positive: the fit can bound a step.
  bool ready() const { return prefill_steps_ >= kMinObservations && fit()[2] > 0; }
  // The scheduler's budget for steps of target_s seconds, from the fit (ready() first).
  Scheduler::PrefillBudget budget(double target_s) const;

 private:
  std::array<std::array<double, 3>, 3> xtx_{};  // decayed sums of x x^T, x = (1, tokens, pairs) scaled
  std::array<double, 3> xty_{};
  int prefill_steps_ = 0;
};

}  // namespace moonrun
