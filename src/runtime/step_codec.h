#pragma once
// A step as bytes, for the nodes of a multi-node group: node 0 schedules, every other node
// runs the same forward over the same batch (its ranks' shards), so it needs each
// sequence's new tokens, positions, cache slot and pages, and the step's state-slot
// copies. Sampling stays on node 0 (rank 0 samples), so sampling rows do not travel.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/model_runner.h"

namespace moonrun {

std::string encode_step(const StepInput& input);

// A decoded step and the storage its spans point into.
struct DecodedStep {
  std::vector<std::vector<int32_t>> tokens, pages;
  StepInput input;
};
Result<DecodedStep> decode_step(const std::string& bytes);

}  // namespace moonrun
