#pragma once
// Pipeline parallelism (--pp-size, issue 41): the model's layers cut into contiguous
// stages, each stage a tensor/expert-parallel group of its own. Stage 0 also holds the
// embedding (and a vision tower), the last stage the final norm and lm_head; a layer's
// weights, KDA state and MLA/indexer pages live on its stage only. One function decides
// the cut for the runtime and for `moonrun plan`, so the plan prints the layers a run uses.
#include <climits>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/config.h"

namespace moonrun {

// The layers one rank runs: all of them without pipeline parallelism.
struct StageLayers {
  int stage = 0;
  int num_stages = 1;
  int first_layer = 0;
  int end_layer = INT_MAX;  // [first_layer, end_layer)
  bool first() const { return stage == 0; }
  bool last() const { return stage == num_stages - 1; }
  bool has(int layer) const { return layer >= first_layer && layer < end_layer; }
};

// pp + 1 bounds, stage s = [bounds[s], bounds[s + 1]): contiguous, at least one layer each,
// minimising the busiest stage's bytes, stage 0 also carrying `pre` and the last `post`.
// Exact (a DP over the cut points; layers and stages are few).
std::vector<int> balanced_layer_bounds(const std::vector<uint64_t>& layer_bytes, uint64_t pre, uint64_t post, int pp);

// Stage `stage` of `pp` for a rank of a tp x ep group: layers balanced by the bytes one
// rank holds of each (model/weight_spec.h, rank_tensor_bytes). Fails when pp does not fit.
Result<StageLayers> stage_layers(const ModelConfig& cfg, int tp, int ep, int pp, int stage);

}  // namespace moonrun
