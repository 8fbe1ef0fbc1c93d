#include "backend/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace moonrun::cpu {

void route_token(const float* logits, const float* bias, const RouterParams& p, int* expert_ids,
                 float* weights) {
  const int E = p.num_experts;
  std::vector<float> score(E), choice(E);  // [E] sigmoid scores, biased scores
  for (int e = 0; e < E; ++e) {
    score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = score[e] + (bias ? bias[e] : 0.0f);
  }
  // Grouped choice: mask every expert outside the topk_group best groups.
  if (p.num_expert_group > 1 && p.num_expert_group > p.topk_group) {
    const int G = p.num_expert_group, per_group = E / G;
    std::vector<float> group_score(G);
    for (int g = 0; g < G; ++g) {
      float best = -INFINITY, second = -INFINITY;
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
        if (choice[e] > best) {
          second = best;
          best = choice[e];
        } else if (choice[e] > second) {
          second = choice[e];
        }
      }
      group_score[g] = best + second;
    }
    std::vector<int> groups(G);
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(),
                     [&](int a, int b) { return group_score[a] > group_score[b]; });
    std::vector<bool> keep(G, false);
    for (int i = 0; i < p.topk_group; ++i) keep[groups[i]] = true;
    for (int e = 0; e < E; ++e)
      if (!keep[e / per_group]) choice[e] = -INFINITY;
  }
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + p.top_k, order.end(), [&](int a, int b) {
    return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
  });
  float sum = 0;
  for (int k = 0; k < p.top_k; ++k) {
    expert_ids[k] = order[k];
    weights[k] = score[order[k]];
    sum += weights[k];
  }
  if (p.top_k > 1 && p.renormalize) {
    const float denom = sum + 1e-20f;
    for (int k = 0; k < p.top_k; ++k) weights[k] /= denom;
  }
  for (int k = 0; k < p.top_k; ++k) weights[k] *= p.routed_scaling_factor;
}

}  // namespace moonrun::cpu
