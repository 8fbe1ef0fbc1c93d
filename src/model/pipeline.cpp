#include "model/pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "model/weight_spec.h"

namespace moonrun {

std::vector<int> balanced_layer_bounds(const std::vector<uint64_t>& layer, uint64_t pre, uint64_t post, int pp) {
  const int L = static_cast<int>(layer.size());
  pp = std::clamp(pp, 1, std::max(L, 1));
  std::vector<uint64_t> prefix(size_t(L) + 1, 0);
  for (int i = 0; i < L; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + layer[size_t(i)];
  auto cost = [&](int a, int b) {
    return prefix[size_t(b)] - prefix[size_t(a)] + (a == 0 ? pre : 0) + (b == L ? post : 0);
  };
  constexpr uint64_t kInf = std::numeric_limits<uint64_t>::max();
  // best[s][j]: stages 0..s-1 over layers [0, j), each stage at least one layer.
  std::vector<std::vector<uint64_t>> best(size_t(pp) + 1, std::vector<uint64_t>(size_t(L) + 1, kInf));
  std::vector<std::vector<int>> from(size_t(pp) + 1, std::vector<int>(size_t(L) + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= pp; ++s)
    for (int j = s; j <= L; ++j)
      for (int i = s - 1; i < j; ++i) {
        if (best[size_t(s) - 1][size_t(i)] == kInf) continue;
        const uint64_t c = std::max(best[size_t(s) - 1][size_t(i)], cost(i, j));
        if (c < best[size_t(s)][size_t(j)]) best[size_t(s)][size_t(j)] = c, from[size_t(s)][size_t(j)] = i;
      }
  std::vector<int> bounds(size_t(pp) + 1, L);
  for (int s = pp, j = L; s > 0; --s) {
    bounds[size_t(s)] = j;
    j = from[size_t(s)][size_t(j)];
    bounds[size_t(s) - 1] = j;
  }
  return bounds;
}

Result<StageLayers> stage_layers(const ModelConfig& cfg, int tp, int ep, int pp, int stage) {
  const int L = cfg.num_hidden_layers;
  if (pp < 1) return invalid_argument("--pp-size must be >= 1, got " + std::to_string(pp));
  if (pp > L)
    return invalid_argument("--pp-size " + std::to_string(pp) + " is more stages than the model's " +
                            std::to_string(L) + " layers (num_hidden_layers)");
  if (stage < 0 || stage >= pp)
    return invalid_argument("pipeline stage " + std::to_string(stage) + " of " + std::to_string(pp));
  StageLayers out;
  out.stage = stage;
  out.num_stages = pp;
  if (pp == 1) {
    out.first_layer = 0;
    out.end_layer = L;
    return out;
  }
  const ParallelRank rank0{0, tp, ep};
  std::vector<uint64_t> layer(size_t(L), 0);
  uint64_t pre = 0, post = 0;
  const std::string layer_prefix = cfg.tensor_prefix + "layers.";
  for (const TensorSpec& t : weight_spec(cfg)) {
    const uint64_t bytes = rank_tensor_bytes(t, rank0, cfg.num_experts);
    if (t.name.rfind(layer_prefix, 0) == 0) {
      const int i = std::atoi(t.name.c_str() + layer_prefix.size());
      if (i >= 0 && i < L) {
        layer[size_t(i)] += bytes;
        continue;
      }
    }
    // Everything outside the layers is stage 0's (the ring) but the output AttnRes mix.
    (t.name.find("output_attn_res") != std::string::npos ? post : pre) += bytes;
  }
  const std::vector<int> bounds = balanced_layer_bounds(layer, pre, post, pp);
  out.first_layer = bounds[size_t(stage)];
  out.end_layer = bounds[size_t(stage) + 1];
  return out;
}

}  // namespace moonrun
