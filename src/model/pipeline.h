#pragma once
// Pipeline parallelism (--pp-size, issue 41): the model's layers cut into contiguous
// stages, each stage a tensor/expert-parallel group of its own; a layer's weights, KDA
// state and MLA/indexer pages live on its stage only. The stages form a ring: stage 0 holds
// the embedding (and a vision tower) and also the final norm and lm_head, so after the last
// stage's layers (and its output AttnRes mix) the rows that get logits, [rows, hidden] F32,
// go back to stage 0, which computes the logits and samples. Rank 0 answers every step as
// without stages, so the multi-node control plane (node 0 schedules and samples) holds as
// it is; the price is one more hop of a few KB a step and lm_head's bytes on stage 0.
// One function decides the cut for the runtime and for `moonrun plan`, so the plan prints
// the layers a run uses.
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
// minimising the busiest stage's bytes, stage 0 also carrying `pre` (embedding, norm,
// lm_head, vision) and the last `post` (the output AttnRes mix).
// Exact (a DP over the cut points; layers and stages are few).
std::vector<int> balanced_layer_bounds(const std::vector<uint64_t>& layer_bytes, uint64_t pre, uint64_t post, int pp);

// Stage `stage` of `pp` for a rank of a tp x ep group: layers balanced by the bytes one
// rank holds of each (model/weight_spec.h, rank_tensor_bytes). Fails when pp does not fit.
Result<StageLayers> stage_layers(const ModelConfig& cfg, int tp, int ep, int pp, int stage);

}  // namespace moonrun
