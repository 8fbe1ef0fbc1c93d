#pragma once
// Fair chunking by time (--max-prefill-step-ms, issue 47): the attention budget that keeps a
// step carrying a prefill chunk under a target time, learned from the engine's own steps.
//
// The scheduler cuts chunks to a budget of query-key pairs (scheduler.h, "fair chunking");
// what a pair costs depends on the model and the device. A step's time is close to
//   t = t0 + a * tokens + c * pairs
// (t0 the step's fixed part: launches, the weights every step reads; a the per-token work
// of every layer; c a query-key pair's, which dominates late in a long prompt). A chunk
// after `context` cached positions also pays for them once whatever its length: plain-order
// MLA expands kv_b over every cached latent it attends to (ops.h, mla_prefill_key_block; at
// 1M positions of the K3-width slice ~26 TFLOP, more than the whole 30 ms target by itself
// on an H100). That work is counted in pairs: context_pairs (kv_lora * (nope + v) /
// (nope + rope + v) a position, 409.6 for K3's and K2's MLA: the expansion's FLOPs over a
// pair's; EngineConfig::prefill_context_pairs) pairs a cached position, so the fit keeps
// three unknowns (a fourth, context, would be collinear with pairs at a fixed chunk size:
// a live fit on the H100 laid the pairs' cost on it and paced nothing). The pacer fits the
// three by least squares over recent steps (sums decayed by kDecay a step, a small
// ridge so that the early, collinear steps stay solvable); the engine hands the scheduler
// target - t0 as the step's budget at a and c (Scheduler::PrefillBudget), and the scheduler
// cuts each chunk to what fits beside the decodes and its own context pairs. Until a pair's cost has been seen (a few
// prefill steps with attention), there is no bound.
//
// A target at or below the fixed part cannot be met by cutting chunks: every step re-reads
// the weights the prompt's tokens route to (~13 ms on an H100 for the K3-width slice) and
// runs the streams' decodes. The prompt then gets as much of a step as its fixed part
// (budget(): max(target - t0, t0); a chunk's context part counts as fixed too:
// Scheduler::fair_chunk), so a step takes at most about twice its fixed part and the
// prompt's time to first token at most about twice its unpaced one, where a budget of zero
// (32-token chunks, each re-reading the weights) made a 1M-token prompt take over seven
// minutes beside 8 streams on an H100 (2026-12-07), and a budget blind to the context part
// (chunks of a few hundred tokens late in the prompt, each expanding ~1M latents) still
// left it without a first token after 280 s (alone: 100 s).
#include <array>
#include <cstdint>

#include "engine/scheduler.h"

namespace moonrun {

class PrefillPacer {
 public:
  static constexpr double kDecay = 0.98;
  static constexpr int kMinObservations = 4;  // prefill steps with pairs before any bound

  // Pairs a cached position costs a chunk that starts after it (see above; 0: none).
  void set_context_pairs(double pairs_per_position) { context_pairs_ = pairs_per_position; }
  // A step ran: `tokens` tokens in all, its prefill chunks `pairs` query-key pairs after
  // `context` cached positions (summed over its chunks; counted as context_pairs each).
  void record(int64_t tokens, int64_t pairs, int64_t context, double seconds);
  // The fitted t0 (seconds), a (seconds a token), c (seconds a pair); zeros until solvable.
  std::array<double, 3> fit() const;
  // Enough prefill steps seen, and a pair's cost positive: the fit can bound a step.
  bool ready() const { return prefill_steps_ >= kMinObservations && fit()[2] > 0; }
  // The scheduler's budget for steps of target_s seconds, from the fit (ready() first).
  Scheduler::PrefillBudget budget(double target_s) const;

 private:
  std::array<std::array<double, 3>, 3> xtx_{};  // decayed sums of x x^T, x = (1, tokens, pairs) scaled
  std::array<double, 3> xty_{};
  double context_pairs_ = 0;
  int prefill_steps_ = 0;
};

}  // namespace moonrun
