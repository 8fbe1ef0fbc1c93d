#pragma once
// The collectives of a tensor/expert-parallel group, timed as the forward issues them: the
// all-reduce of the hidden rows after each attention and dense MLP ([tokens, hidden] F32)
// and the MoE combine, the all-reduce of the routed experts' outputs at the experts' width
// ([tokens, latent] F32; moonrun has no dispatch collective: every rank holds every token
// and runs its own experts on them, model/layers/moe.cpp). Each is timed eagerly (calls
// back to back on the rank's stream) and captured (a CUDA graph of the calls, replayed, as
// a decode step runs them), on every rank of the group at once; the figures are rank 0's.
// Before timing, one call on known values checks the sum on every rank.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "common/status.h"

namespace moonrun::tools {

struct CollectiveFigure {
  std::string op;     // "all_reduce_sum"
  std::string what;   // "hidden rows (attention / dense MLP out)", "MoE combine (experts' width)"
  int rows = 0, cols = 0;
  bool captured = false;  // replayed from a CUDA graph (false: eager calls)
  double us = 0;          // one call, mean over back-to-back calls
  double bytes() const { return 4.0 * rows * cols; }
};

struct CollectiveBench {
  int world = 0;
  std::string transport;  // "nccl", "threads"
  bool sums_checked = false;
  std::vector<CollectiveFigure> figures;
};

// ranks[r]: rank r's backend, every rank of one group in this process. hidden / expert_width:
// the model's widths (expert_width 0: no MoE); tokens: the row counts to time (decode batches).
Result<CollectiveBench> run_collective_bench(const std::vector<Ops*>& ranks, int hidden, int expert_width,
                                             const std::vector<int>& tokens);
std::string format_collective_bench(const CollectiveBench& bench);
nlohmann::json collective_bench_to_json(const CollectiveBench& bench);

}  // namespace moonrun::tools
